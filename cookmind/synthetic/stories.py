"""Short, simple stories in the style of TinyStories, from a grammar of templates."""

from __future__ import annotations

import random

from cookmind.synthetic.rng import make_rng
from cookmind.synthetic.vocabulary import ADJECTIVES, ANIMALS, COLORS, FEELINGS, NAMES, OBJECTS, PLACES


def _a(word: str) -> str:
    """The indefinite article for ``word``."""
    return "an" if word[0] in "aeiou" else "a"


def make_story(rng: random.Random) -> str:
    """One story of five to eight sentences with a character, a problem and an ending."""
    (name, he), (friend, _) = rng.sample(NAMES, 2)
    his = {"he": "his", "she": "her"}[he]
    animal, adj, place = rng.choice(ANIMALS), rng.choice(ADJECTIVES), rng.choice(PLACES)
    obj, color = rng.choice(OBJECTS), rng.choice(COLORS)
    feel1, feel2 = rng.sample(FEELINGS, 2)
    opening = rng.choice(
        [
            f"Once upon a time, there was {_a(adj)} {adj} {animal} named {name}.",
            f"One day, {_a(adj)} {adj} {animal} called {name} woke up early.",
            f"There was {_a(adj)} {adj} {animal}. {his.capitalize()} name was {name}.",
        ]
    )
    middle = [
        f"{he.capitalize()} lived in {_a(place)} {place} with {his} friend {friend}.",
        rng.choice(
            [
                f"{name} found {_a(color)} {color} {obj} near a tree.",
                f"{name} wanted to play with {_a(color)} {color} {obj}.",
                f"{name} lost {his} {color} {obj} in the {place}.",
            ]
        ),
        f"{name} felt {feel1}.",
        rng.choice(
            [
                f'{friend} said, "Let us look for it together."',
                f"{friend} came to help {name}.",
                f'"Can I play too?" asked {friend}.',
            ]
        ),
    ]
    if rng.random() < 0.5:
        middle.append(f"They walked around the {place} and looked everywhere.")
    if rng.random() < 0.5:
        middle.append(
            rng.choice(
                [
                    "The sun was warm and the wind was soft.",
                    "It started to rain, so they ran under a big tree.",
                    f"A {rng.choice(ANIMALS)} watched them from far away.",
                ]
            )
        )
    ending = rng.choice(
        [
            f"At last, they found the {obj}, and {name} felt {feel2}.",
            f"In the end, {name} and {friend} shared the {obj} and became best friends.",
            f"{name} said thank you to {friend}. They played until the sun went down.",
        ]
    )
    moral = rng.choice(["", "", " Helping a friend makes everyone happy.", " It is good to share."])
    return " ".join([opening, *middle, ending]) + moral


def stories(n: int, seed: int = 0) -> list[str]:
    """``n`` stories from ``seed``."""
    rng = make_rng(seed, "stories")
    return [make_story(rng) for _ in range(n)]
