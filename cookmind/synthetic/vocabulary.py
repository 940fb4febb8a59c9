"""Word lists shared by the synthetic generators (small on purpose: a tiny model can learn them)."""

NAMES = [
    ("Tom", "he"),
    ("Lily", "she"),
    ("Sam", "he"),
    ("Mia", "she"),
    ("Ben", "he"),
    ("Anna", "she"),
    ("Max", "he"),
    ("Lucy", "she"),
    ("Leo", "he"),
    ("Emma", "she"),
    ("Jack", "he"),
    ("Zoe", "she"),
    ("Finn", "he"),
    ("Ella", "she"),
    ("Noah", "he"),
    ("Ruby", "she"),
]
ANIMALS = ["cat", "dog", "bird", "fox", "rabbit", "bear", "duck", "frog", "mouse", "horse"]
ADJECTIVES = ["little", "happy", "brave", "kind", "small", "big", "curious", "sleepy", "funny", "shy"]
PLACES = ["forest", "garden", "park", "house", "village", "farm", "town", "meadow", "beach", "school"]
OBJECTS = ["ball", "box", "kite", "hat", "book", "key", "shell", "stone", "flower", "cake"]
COLORS = ["red", "blue", "green", "yellow", "pink", "purple", "orange", "white"]
FEELINGS = ["happy", "sad", "excited", "scared", "proud", "tired", "surprised", "calm"]
ITEMS = [
    "apples",
    "pencils",
    "cookies",
    "marbles",
    "stickers",
    "books",
    "toys",
    "cards",
    "shells",
    "balloons",
    "oranges",
    "coins",
    "flowers",
    "candies",
    "eggs",
]

# Simple facts for chats: (question, answer).
FACTS = [
    ("What color is the sky?", "The sky is blue."),
    ("What color is grass?", "Grass is green."),
    ("What sound does a dog make?", "A dog says woof."),
    ("What sound does a cat make?", "A cat says meow."),
    ("What sound does a duck make?", "A duck says quack."),
    ("How many legs does a dog have?", "A dog has four legs."),
    ("How many legs does a bird have?", "A bird has two legs."),
    ("What do bees make?", "Bees make honey."),
    ("Where do fish live?", "Fish live in water."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("What is the opposite of big?", "The opposite of big is small."),
    ("What do cows give us?", "Cows give us milk."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("What color is snow?", "Snow is white."),
    ("What shines in the sky during the day?", "The sun shines in the sky during the day."),
    ("What do we use to write?", "We use a pencil or a pen to write."),
]

GREETINGS = [
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi there.", "Hi! What would you like to talk about?"),
    ("Good morning!", "Good morning! I hope you have a nice day."),
    ("Who are you?", "I am CookMind, a small assistant. I can answer simple questions and solve math problems."),
    ("Thank you!", "You are welcome!"),
    ("Can you help me?", "Yes, of course. What do you need?"),
]

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are CookMind, a small and friendly assistant.",
    "Answer briefly and clearly.",
]
