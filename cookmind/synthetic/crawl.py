"""A seeded synthetic web crawl: the raw input of `cookmind curate` in the demo and the tests.

Pages look like small cooking sites: navigation, a header, an article, a sidebar and a footer.
Mixed in, in known numbers, is everything curation must deal with: pages in other languages,
exact copies and near copies (a few words edited), e-mail addresses, phone numbers and IP
addresses, keyword spam that fails the Gopher rules, fluent SEO spam only a quality classifier
catches, explicit pages and abusive comment threads. ``make_crawl`` returns the pages and a
manifest of how many of each kind it made, so a test can check what each stage removed.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import random
import re
from collections import Counter
from pathlib import Path

from cookmind.atomic import building_dir, is_temp_name, write_json

# Share of each page kind; "good" takes the rest.
MIX = {
    "foreign": 0.08,
    "spam": 0.08,
    "exact_dup": 0.05,
    "near_dup": 0.05,
    "seo_spam": 0.06,
    "nsfw": 0.03,
    "toxic": 0.03,
}
PII_SHARE = 0.25  # of good pages, each gets one e-mail, phone or IP in its text

SITES = [
    "The Slow Kitchen",
    "Pan and Pantry",
    "Weeknight Table",
    "Salt and Season",
    "Green Bowl Notes",
    "Market Day Cooking",
    "Hearth and Home",
    "Simple Suppers",
]
NAV = ["Home", "Recipes", "Techniques", "About", "Shop", "Newsletter", "Contact"]
FOOTER = "All rights reserved. Privacy policy. Terms of use. Cookie settings."
NEWSLETTER = "Subscribe to our newsletter to get new recipes in your inbox every week."

DISHES = [
    "tomato soup",
    "lentil stew",
    "roast chicken",
    "apple pie",
    "mushroom risotto",
    "banana bread",
    "vegetable curry",
    "pumpkin soup",
    "lemon tart",
    "bean chili",
    "potato gratin",
    "fish pie",
    "pancakes",
    "fried rice",
    "minestrone",
    "carrot cake",
    "shepherd's pie",
    "onion tart",
    "pea soup",
    "plum crumble",
    "cheese scones",
    "chickpea salad",
    "beef stew",
    "rice pudding",
]
INGREDIENTS = [
    "butter",
    "olive oil",
    "garlic",
    "onions",
    "fresh thyme",
    "black pepper",
    "sea salt",
    "brown sugar",
    "lemon zest",
    "chopped parsley",
    "ground cumin",
    "smoked paprika",
    "cream",
    "carrots",
    "celery",
    "white wine",
    "chicken stock",
    "flour",
    "eggs",
    "honey",
    "ginger",
    "red lentils",
    "spinach",
    "rosemary",
    "cinnamon",
    "nutmeg",
    "dried chili",
    "oats",
]
TOOLS = [
    "a heavy pan",
    "a wooden spoon",
    "a sharp knife",
    "a large pot",
    "a baking tray",
    "a whisk",
    "a cast iron skillet",
    "a mixing bowl",
    "a sieve",
    "a rolling pin",
    "a grater",
    "a blender",
]
PEOPLE = [
    "my grandmother",
    "my neighbour",
    "an old friend",
    "my brother",
    "a chef I once worked with",
    "my aunt",
    "a baker in our town",
    "my daughter",
    "a farmer at the market",
    "my teacher",
]
PLACES = [
    "the market",
    "a small village",
    "the coast",
    "our garden",
    "a busy city kitchen",
    "the mountains",
    "a farm near the river",
    "my first flat",
    "a school kitchen",
    "a seaside cafe",
]
FEELINGS = ["comforting", "bright", "warming", "simple", "rich", "fresh", "honest", "generous", "quiet"]
SEASONS = ["winter", "spring", "summer", "autumn"]
VERBS = ["stir", "taste", "season", "simmer", "fold", "chop", "roast", "whisk", "rest", "slice"]
FIRST_NAMES = ["anna", "ben", "carla", "david", "elena", "frank", "grace", "hugo", "iris", "jonas", "kate", "leo"]
LAST_NAMES = ["miller", "lopez", "novak", "smith", "rossi", "khan", "berg", "costa", "ward", "young"]
DOMAINS = ["example.com", "kitchenmail.org", "cookmail.net", "recipes-example.com", "pantry.example.org"]

SENTENCES = [
    "The secret to a good {dish} is patience, so give the {ing} time to soften before you add anything else.",
    "I first learned to make {dish} from {person}, who never measured a thing and never needed to.",
    "Warm {ing} in {tool} over a low heat and {verb} gently until the kitchen smells {feel}.",
    "If you cannot find {ing}, {ing2} works well and gives the dish a slightly different character.",
    "In {season} we make this {dish} at least once a week, because it is {feel} and cheap to cook.",
    "Most recipes tell you to rush this step, but the flavour of the {dish} depends on it.",
    "Keep {tool} close by, because you will need to {verb} the mixture every few minutes.",
    "When I lived near {place}, we bought {ing} every morning and cooked whatever looked best.",
    "A pinch of {ing} at the end lifts the whole {dish} and makes it taste brighter.",
    "Let the {dish} rest for ten minutes before serving, so that the juices settle and the texture improves.",
    "There is nothing complicated here: good {ing}, a little {ing2} and some time are all you need.",
    "Children love to help with this one, and they can {verb} the {ing} while you prepare the rest.",
    "The first time I made {dish} it was a disaster, and {person} laughed about it for years.",
    "You can make the {dish} a day ahead, and it often tastes better the next day.",
    "Use {tool} if you have one, although any sturdy pan will do the job just as well.",
    "The smell of {ing} and {ing2} always reminds me of {place} in {season}.",
    "Taste as you go and adjust the {ing} to your liking, because every kitchen is different.",
    "Serve the {dish} with crusty bread and a simple green salad for a {feel} supper.",
    "Some cooks add {ing} at the start, but I prefer to {verb} it in near the end of cooking.",
    "This is the kind of {feel} food that {person} would cook on a cold {season} evening.",
    "Cut the {ing} into even pieces so that they cook at the same speed.",
    "If the {dish} looks too thick, add a splash of water and {verb} again until it loosens.",
    "We grew our own {ing} one year, and the difference in taste surprised everyone.",
    "Leftover {dish} keeps well in the fridge for three days and freezes for a month.",
    "Do not be afraid of {ing}, since a generous amount is what makes the {dish} sing.",
    "When {person} visited {place}, they brought back a jar of {ing} that we still talk about.",
    "Bake it in a hot oven until the top turns golden, then turn the heat down a little.",
    "My notebook from those years is full of stains, crossed out lines and small drawings of {dish}.",
    "Nobody agrees on the right amount of {ing}, which is part of the fun of cooking for friends.",
    "On busy evenings I double the quantities and freeze half for later.",
    "A cheap knife that is sharp beats an expensive one that is blunt, as {person} likes to remind me.",
    "Rinse the {ing} under cold water and pat it dry with a clean towel.",
    "The recipe below serves four hungry people, or six if you add a side dish.",
    "Our oven runs a little hot, so check the {dish} five minutes early.",
    "I like to finish the plate with {ing2} and a drizzle of good oil.",
    "It took me years to understand why {person} always warmed the plates first.",
    "Spring onions, radishes and young peas turn up at {place} long before the tomatoes arrive.",
    "Write down what you change each time, and soon the recipe will become your own.",
    "Good bread needs only flour, water, salt and yeast, plus a little patience.",
    "Whatever you do, keep tasting, because recipes are maps and not rules.",
    "Sometimes the simplest meals are the ones people remember for the longest time.",
    "We ate outside that evening while the light faded over {place}.",
]
TITLES = [
    "How to make {dish} at home",
    "A {feel} {dish} for {season}",
    "My favourite {dish}",
    "{dish_cap}, the easy way",
    "Notes on {dish}",
    "Why I keep cooking {dish}",
    "A {season} {dish} from {place}",
    "Learning {dish} from {person}",
]

FOREIGN = {
    "fr": [
        "La cuisine de ma grand-mère était simple et généreuse.",
        "Nous achetons les légumes au marché chaque samedi matin.",
        "Il faut laisser mijoter la soupe pendant une heure avec les herbes fraîches.",
        "Le pain est encore chaud quand nous rentrons à la maison.",
        "Cette recette est facile et les enfants l'adorent.",
        "Ajoutez le beurre et le sel, puis remuez doucement avec une cuillère en bois.",
    ],
    "de": [
        "Das Rezept meiner Großmutter ist einfach und sehr lecker.",
        "Wir kaufen das Gemüse jeden Samstag auf dem Markt.",
        "Die Suppe muss eine Stunde lang mit frischen Kräutern köcheln.",
        "Das Brot ist noch warm, wenn wir nach Hause kommen.",
        "Dieses Gericht ist schnell gemacht und schmeckt der ganzen Familie.",
        "Butter und Salz dazugeben und vorsichtig umrühren.",
    ],
    "es": [
        "La receta de mi abuela es sencilla y deliciosa.",
        "Compramos las verduras en el mercado todos los sábados.",
        "La sopa tiene que hervir a fuego lento durante una hora con hierbas frescas.",
        "El pan todavía está caliente cuando llegamos a casa.",
        "Este plato es fácil de preparar y a los niños les encanta.",
        "Añade la mantequilla y la sal, y remueve con una cuchara de madera.",
    ],
}
SPAM_WORDS = [
    "buy now",
    "best price",
    "click here",
    "free shipping",
    "limited offer",
    "cheap deals",
    "order today",
    "win big",
    "best deal",
    "top rated",
    "lowest price",
    "act now",
]
SEO = [
    "Buy the best cheap {product} online today and enjoy free shipping with every single order you place.",
    "Our {product} are the lowest price on the internet, so click here now to claim your exclusive discount code.",
    "Thousands of happy customers trust our {product} because we offer the best deals and a money back guarantee.",
    "Order {product} now with fast delivery, and you will also win a bonus gift card worth one hundred dollars.",
    "Looking for discount {product}? We have the biggest sale of the year with prices that beat every competitor.",
    "Limited time offer on premium {product}, so hurry up and buy now before the stock runs out forever.",
    "Get instant access to the best {product} deals and join our casino bonus program for extra free spins.",
    "Why pay more for {product} when you can get the same quality for half the price from our trusted store?",
    "Sign up today and get exclusive coupons for {product}, weight loss pills and cheap luxury replica watches.",
    "Best {product} reviews, top ten rankings and the cheapest offers, all updated every hour by our experts.",
]
PRODUCTS = [
    "replica watches",
    "diet pills",
    "kitchen gadgets",
    "casino chips",
    "designer handbags",
    "weight loss tea",
    "cheap sneakers",
    "crypto coins",
    "phone cases",
    "discount perfume",
]
NSFW = [
    "Hot {w1} {w2} videos and {w3} pictures are waiting for you, so join the {w4} club today and see everything.",
    "The best {w1} site has thousands of {w2} models, {w3} chats and {w4} galleries that are updated every day.",
    "Meet {w1} singles near you for {w2} fun, {w3} webcam shows and {w4} nights without any limits at all.",
    "Our {w1} members get unlimited access to {w2} clips, private {w3} rooms and {w4} stories.",
    "Tonight only, watch {w1} and {w2} streams for free when you sign up for a {w3} {w4} account.",
    "Click to see the {w1} photos that everyone is talking about, with {w2} and {w3} content for {w4} adults.",
]
NSFW_WORDS = ["porn", "xxx", "nude", "sexy", "erotic", "hardcore", "naked", "escort", "webcam", "fetish", "horny"]
INSULTS = [
    "You are a stupid idiot and nobody cares about your crap opinion.",
    "Shut up, moron, this recipe is garbage and so are you.",
    "What a damn pathetic loser you are, go away and stop posting.",
    "Only an idiot would cook like this, you brainless fool.",
    "This is the dumbest crap I have ever read, you useless clown.",
]


@dataclasses.dataclass
class Page:
    """One crawled page with the kind the generator made it as (the curation's ground truth)."""

    url: str
    html: str
    kind: str
    lang: str = "en"
    pii: str | None = None  # "emails" | "phones" | "ips" when the page carries one


def _fill(template: str, rng: random.Random) -> str:
    dish = rng.choice(DISHES)
    ing, ing2 = rng.sample(INGREDIENTS, 2)
    return template.format(
        dish=dish,
        dish_cap=dish.capitalize(),
        ing=ing,
        ing2=ing2,
        tool=rng.choice(TOOLS),
        person=rng.choice(PEOPLE),
        place=rng.choice(PLACES),
        feel=rng.choice(FEELINGS),
        season=rng.choice(SEASONS),
        verb=rng.choice(VERBS),
    )


def prose_paragraphs(rng: random.Random, n_paragraphs: int | None = None) -> list[str]:
    """English cooking prose: 3..5 paragraphs of 3..4 sentences, each template used once per page.

    Using a template twice would repeat its fixed words, which the Gopher duplicate-n-gram rules
    (rightly) count against a page.
    """
    n = n_paragraphs or rng.randint(3, 5)
    sizes = [rng.randint(3, 4) for _ in range(n)]
    order = rng.sample(SENTENCES, sum(sizes))
    out, k = [], 0
    for size in sizes:
        out.append(" ".join(_fill(t, rng) for t in order[k : k + size]))
        k += size
    return out


def _pii_sentence(rng: random.Random, kind: str) -> str:
    if kind == "emails":
        who = f"{rng.choice(FIRST_NAMES)}.{rng.choice(LAST_NAMES)}{rng.randint(1, 999)}@{rng.choice(DOMAINS)}"
        return f"If you have questions about this recipe, write to me at {who} and I will answer."
    if kind == "phones":
        area, mid, end = rng.randint(201, 989), rng.randint(200, 999), rng.randint(1000, 9999)
        number = rng.choice(
            [
                f"({area}) {mid}-{end}",
                f"{area}-{mid}-{end}",
                f"+1 {area} {mid} {end}",
                f"+44 20 {rng.randint(7000, 7999)} {rng.randint(1000, 9999)}",
            ]
        )
        return f"To book a place in our cooking class, call us on {number} during the week."
    ip = ".".join(str(rng.randint(11, 223)) for _ in range(4))
    return f"Our recipe server moved, and the old address {ip} will stop working next month."


def _page_html(title: str, paragraphs: list[str], rng: random.Random, lang: str = "en") -> str:
    site = rng.choice(SITES)
    nav = "".join(f'<li><a href="/{x.lower()}">{x}</a></li>' for x in NAV)
    body = "".join(f"<p>{p}</p>\n" for p in paragraphs)
    related = "".join(f'<li><a href="/r/{i}">{_fill(rng.choice(TITLES), rng)}</a></li>' for i in range(3))
    return (
        f'<!DOCTYPE html>\n<html lang="{lang}"><head><meta charset="utf-8"><title>{title} | {site}</title>'
        f'<script>var tracking = "{rng.getrandbits(32):08x}";</script></head>\n<body>\n'
        f'<header><div class="logo">{site}</div><nav><ul>{nav}</ul></nav></header>\n'
        f"<main><article><h1>{title}</h1>\n{body}</article></main>\n"
        f'<aside class="sidebar"><h3>Related posts</h3><ul>{related}</ul></aside>\n'
        f"<footer><p>&copy; 2026 {site}. {FOOTER}</p></footer>\n</body></html>\n"
    )


def _good(rng: random.Random) -> tuple[str, list[str]]:
    title = _fill(rng.choice(TITLES), rng)
    title = title[0].upper() + title[1:]
    paragraphs = prose_paragraphs(rng)
    if rng.random() < 0.5:
        paragraphs.append(NEWSLETTER)  # the same line on many pages: exact-line dedup removes it
    return title, paragraphs


def _edit_words(paragraphs: list[str], rng: random.Random, n_edits: int = 3) -> list[str]:
    """A near copy: ``n_edits`` single words replaced (Jaccard of 5-grams stays about 0.9)."""
    paragraphs = list(paragraphs)
    for _ in range(n_edits):
        k = rng.randrange(len(paragraphs))
        words = paragraphs[k].split(" ")
        words[rng.randrange(len(words))] = rng.choice(["really", "truly", "simply", "always", "often"])
        paragraphs[k] = " ".join(words)
    return paragraphs


class _Pages(list):
    """The pages made so far, each counted on ``bar`` as it is added (the generators append them kind by kind)."""

    def __init__(self, bar):
        super().__init__()
        self.bar = bar

    def append(self, page: Page) -> None:
        super().append(page)
        self.bar.update(1)


def make_crawl(num_pages: int = 600, seed: int = 0, progress: bool = False) -> tuple[list[Page], dict]:
    """``num_pages`` pages in a seeded shuffled order, and a manifest {kind: count, "pii": {...}}. ``progress``
    counts the pages made on a bar (``cookmind.progress``: plain lines in a pipe or a log)."""
    from cookmind.progress import progress_bar

    rng = random.Random(f"cookmind-crawl-{seed}")
    counts = {kind: int(round(share * num_pages)) for kind, share in MIX.items()}
    counts["good"] = num_pages - sum(counts.values())
    if counts["good"] < max(1, counts["exact_dup"] + counts["near_dup"]):
        raise ValueError(f"num_pages={num_pages} is too small for the crawl's mix; use at least 20")
    with progress_bar(total=num_pages, desc="crawl: make pages", unit="page", enabled=progress) as bar:
        pages, manifest = _make_pages(rng, counts, num_pages, seed, _Pages(bar))
    return list(pages), manifest


def _make_pages(rng: random.Random, counts: dict, num_pages: int, seed: int, pages: list) -> tuple[list, dict]:
    """``make_crawl``'s pages, appended to ``pages``, and its manifest."""
    originals: list[tuple[str, list[str]]] = []
    pii = Counter()
    for i in range(counts["good"]):
        title, paragraphs = _good(rng)
        kind = None
        if rng.random() < PII_SHARE:
            kind = rng.choice(["emails", "phones", "ips"])
            paragraphs.insert(rng.randint(1, len(paragraphs) - 1), _pii_sentence(rng, kind))
            pii[kind] += 1
        originals.append((title, paragraphs, kind))
        pages.append(Page(f"https://site{i % 8}.example/{i}", _page_html(title, paragraphs, rng), "good", pii=kind))
    # Copies of pages without PII, so masking counts stay those of the kept originals.
    clean = [o for o in originals if o[2] is None]
    for i in range(counts["exact_dup"]):
        title, paragraphs, _ = rng.choice(clean)
        pages.append(Page(f"https://mirror{i % 3}.example/copy/{i}", _page_html(title, paragraphs, rng), "exact_dup"))
    for i in range(counts["near_dup"]):
        title, paragraphs, _ = rng.choice(clean)
        pages.append(
            Page(f"https://scraper.example/{i}", _page_html(title, _edit_words(paragraphs, rng), rng), "near_dup")
        )
    langs = sorted(FOREIGN)
    for i in range(counts["foreign"]):
        lang = langs[i % len(langs)]
        paragraphs = [" ".join(rng.sample(FOREIGN[lang], 4)) for _ in range(rng.randint(3, 5))]
        pages.append(
            Page(
                f"https://{lang}.example/{i}",
                _page_html(FOREIGN[lang][0][:30], paragraphs, rng, lang),
                "foreign",
                lang=lang,
            )
        )
    for i in range(counts["spam"]):
        lines = [" ".join(rng.choices(SPAM_WORDS, k=rng.randint(3, 6))) + " ..." for _ in range(rng.randint(8, 14))]
        pages.append(Page(f"https://spam{i % 5}.example/{i}", _page_html("BEST DEALS", lines, rng), "spam"))
    for i in range(counts["seo_spam"]):
        # each template once per page: fluent enough to pass the Gopher rules
        order = rng.sample(SEO, 9)
        paragraphs = [" ".join(t.format(product=rng.choice(PRODUCTS)) for t in order[k : k + 3]) for k in (0, 3, 6)]
        pages.append(
            Page(f"https://shop{i % 4}.example/{i}", _page_html("Best deals online", paragraphs, rng), "seo_spam")
        )
    for i in range(counts["nsfw"]):
        order, prose = rng.sample(NSFW, 6), rng.sample(SENTENCES, 2)
        paragraphs = [
            " ".join(
                t.format(**dict(zip(("w1", "w2", "w3", "w4"), rng.sample(NSFW_WORDS, 4)))) for t in order[k : k + 3]
            )
            + " "
            + _fill(prose[k // 3], rng)
            for k in (0, 3)
        ]
        pages.append(Page(f"https://adult{i % 3}.example/{i}", _page_html("Hot pictures", paragraphs, rng), "nsfw"))
    for i in range(counts["toxic"]):
        title, paragraphs = _good(rng)
        # signed comments: the same insult on two pages is still two different lines
        comments = [
            f"Comment {rng.randint(1000, 99999)} by {rng.choice(FIRST_NAMES)}: {x}" for x in rng.sample(INSULTS, 3)
        ]
        pages.append(Page(f"https://forum.example/{i}", _page_html(title, paragraphs[:2] + comments, rng), "toxic"))
    rng.shuffle(pages)
    manifest = {
        "num_pages": num_pages,
        "seed": seed,
        "kinds": dict(sorted(Counter(p.kind for p in pages).items())),
        "pii": dict(sorted(pii.items())),
    }
    return pages, manifest


_SHARD = re.compile(r"crawl-\d{5}\.jsonl\.gz")


def is_crawl(path: Path) -> bool:
    """Whether ``path`` is a folder that ``write_crawl`` made: a manifest, shards, and nothing else."""
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    shards = {n for n in names if _SHARD.fullmatch(n)}
    temps = {n for n in names if is_temp_name(n)}  # a shard whose writer died: ours too
    return "manifest.json" in names and bool(shards) and names == shards | temps | {"manifest.json"}


def write_crawl(
    out_dir: str | os.PathLike,
    num_pages: int = 600,
    seed: int = 0,
    num_shards: int = 4,
    replace: bool = False,
    progress: bool = False,
) -> dict:
    """Write the crawl as ``crawl-NNNNN.jsonl.gz`` shards of {"id", "url", "html", "kind"}; returns the manifest.

    The manifest is also written beside the shards as ``manifest.json``. The folder is built whole under a
    temporary name and renamed into place, so a crash leaves the earlier crawl (or none), never a mix. An empty
    folder is filled; a folder holding a crawl is replaced only with ``replace``; a folder holding anything
    else (a file of another name) is refused, even with ``replace``. ``progress``: bars over the pages made and
    written (``cookmind.progress``).
    """
    from cookmind.progress import progress_bar

    out_dir = Path(out_dir)
    empty = out_dir.is_dir() and not out_dir.is_symlink() and not any(out_dir.iterdir())
    if out_dir.exists() and not empty:
        if not is_crawl(out_dir):
            names = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
            other = [n for n in names if not (_SHARD.fullmatch(n) or n == "manifest.json" or is_temp_name(n))]
            what = f"{other[0]} is not a crawl file" if other else "no manifest.json and crawl-NNNNN.jsonl.gz shards"
            raise FileExistsError(
                f"{out_dir} is not a crawl folder ({what if out_dir.is_dir() else 'a file'}); curate crawl writes "
                "into a new or empty folder, and --overwrite replaces only a crawl it wrote: choose another "
                "--output or move that away"
            )
        if not replace:
            raise FileExistsError(
                f"{out_dir} holds a crawl already ({len(list(out_dir.iterdir()))} files); choose another "
                "folder or pass --overwrite to replace it"
            )
    pages, manifest = make_crawl(num_pages, seed, progress)
    if empty:
        out_dir.rmdir()  # an empty folder the user made for us
    with (
        building_dir(out_dir, replace=replace, is_ours=is_crawl, what="crawl folder") as tmp,
        progress_bar(total=len(pages), desc="crawl: write shards", unit="page", enabled=progress) as bar,
    ):
        for s in range(num_shards):
            with gzip.open(tmp / f"crawl-{s:05d}.jsonl.gz", "wt", encoding="utf-8", compresslevel=3) as f:
                for i in range(s, len(pages), num_shards):
                    p = pages[i]
                    f.write(json.dumps({"id": f"page-{i:06d}", "url": p.url, "html": p.html, "kind": p.kind}) + "\n")
                    bar.update(1)
        write_json(tmp / "manifest.json", manifest, indent=2)
    return manifest


def labelled_pages(num_pages: int = 400, seed: int = 1) -> list[dict]:
    """{"html", "label"} for training a quality classifier: good prose "good", spam of both kinds "spam"."""
    pages, _ = make_crawl(num_pages, seed)
    label = {"good": "good", "seo_spam": "spam", "spam": "spam"}
    return [{"html": p.html, "label": label[p.kind]} for p in pages if p.kind in label]
