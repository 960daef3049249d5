"""An offline prompt corpus for distilling the demo draft: chat, how-to, creative, code, summarisation.

Nothing is downloaded: every prompt is built here from hand-written templates,
subjects, code snippets and paragraphs, so the corpus is the same on every
machine. ``build()`` expands all (template, subject) pairs, shuffles them with
a fixed seed and keeps ``num_prompts``; the split is by a hash of the prompt
text, so a prompt is held out or not whatever else is in the corpus::

    build(1200) ──▶ [Prompt(kind, text, heldout)]   ~8% held out (HELDOUT_PERCENT)

The held-out prompts are what acceptance and agreement are reported on; the
draft never trains on them.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass

HELDOUT_PERCENT = 8
SEED = 20240611

TOPICS = [
    "photosynthesis", "black holes", "inflation in economics", "the immune system", "blockchain",
    "the French Revolution", "machine learning", "climate change", "the water cycle", "plate tectonics",
    "the Roman Empire", "quantum computing", "vaccines", "the stock market", "renewable energy",
    "the human heart", "DNA", "the internet", "electric cars", "the theory of evolution",
    "supply and demand", "the Renaissance", "volcanoes", "the moon landing", "artificial intelligence",
    "recycling", "the solar system", "antibiotics", "democracy", "the printing press",
    "gravity", "the Great Wall of China", "coral reefs", "cryptography", "the Industrial Revolution",
    "nuclear energy", "rainforests", "the human brain", "compound interest", "social media",
    "the Olympic Games", "earthquakes", "bees and pollination", "the periodic table", "cloud computing",
    "the Silk Road", "sleep", "the greenhouse effect", "electricity", "the Cold War",
    "operating systems", "neural networks", "ancient Egypt", "ocean tides", "the speed of light",
    "meditation", "healthy eating", "time zones", "credit scores", "the scientific method",
    "3D printing", "the Amazon river", "hurricanes", "World War I", "programming languages",
    "solar panels", "the metric system", "music theory", "the Mona Lisa", "public transport",
    "databases", "version control with git", "the Big Bang", "honey bees", "the Pythagorean theorem",
    "exercise", "the first computers", "coffee", "glaciers", "the human skeleton",
]

EXPLAIN_TEMPLATES = [
    "Explain {x} in simple terms.",
    "What is {x}?",
    "How does {x} work?",
    "Why is {x} important?",
    "Give a short overview of {x}.",
    "Describe {x} to a ten-year-old.",
    "What are three interesting facts about {x}?",
    "Write a short paragraph about {x}.",
    "What are the main ideas behind {x}?",
    "Can you tell me about {x}?",
    "Write three bullet points about {x}.",
    "What should a beginner know about {x}?",
]

ACTIVITIES = [
    "learn a new language", "save money", "improve my sleep", "start running", "learn to cook",
    "become more productive", "prepare for a job interview", "learn to play the guitar", "reduce stress",
    "start a vegetable garden", "learn Python", "write a good essay", "make new friends in a new city",
    "keep my house plants alive", "stay focused while studying", "give a good presentation",
    "train my dog", "eat more vegetables", "start a small business", "read more books",
    "improve my handwriting", "plan a trip to Japan", "learn to swim", "organise my desk",
    "write a cover letter", "learn to draw", "get better at chess", "drink more water",
    "reduce my screen time", "prepare for a marathon", "negotiate a salary", "back up my computer",
]

HOWTO_TEMPLATES = [
    "How can I {y}?",
    "Give me five tips to {y}.",
    "What is the best way to {y}?",
    "I want to {y}. Where should I start?",
    "What are common mistakes people make when they try to {y}?",
    "Make a one-week plan to help me {y}.",
]

THEMES = [
    "the ocean", "autumn leaves", "a rainy day", "a lost cat", "the city at night", "friendship",
    "a mountain village", "the first day of school", "a robot who learns to paint", "a lighthouse keeper",
    "the stars", "a small bakery", "winter morning", "a train journey", "an old library", "a dragon who is afraid of fire",
    "a garden in spring", "a forgotten key", "the desert", "a birthday party",
]

CREATIVE_TEMPLATES = [
    "Write a short poem about {z}.",
    "Write a haiku about {z}.",
    "Tell me a short story about {z}.",
    "Write a limerick about {z}.",
    "Describe {z} in vivid detail.",
    "Write the opening paragraph of a novel about {z}.",
]

EMAILS = [
    ("my manager", "taking a day off next Friday"),
    ("a customer", "a delayed order"),
    ("my landlord", "a broken heater"),
    ("a colleague", "rescheduling our meeting"),
    ("my team", "the launch of a new project"),
    ("a professor", "an extension for my assignment"),
    ("a friend", "inviting them to dinner"),
    ("the support team", "a problem logging into my account"),
    ("a new client", "introducing our services"),
    ("my neighbour", "a noisy party last night"),
]

PRODUCTS = [
    "a reusable water bottle", "noise-cancelling headphones", "a smart watch", "an ergonomic office chair",
    "a solar phone charger", "a coffee grinder", "a hiking backpack", "a mechanical keyboard",
    "a standing desk", "an electric toothbrush",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "removes duplicates from a list while keeping the order",
    "finds the largest element in a list", "checks whether a string is a palindrome",
    "computes the factorial of a number", "merges two sorted lists", "flattens a nested list",
    "counts word frequencies in a text", "converts Celsius to Fahrenheit", "sorts a list of dictionaries by a key",
    "reads a CSV file and returns its rows", "computes the average of a list of numbers",
    "returns the greatest common divisor of two numbers", "checks whether two strings are anagrams",
    "finds the second smallest number in a list", "capitalises the first letter of every word",
    "implements binary search", "generates all permutations of a list", "transposes a matrix",
    "validates an email address with a regular expression", "returns the intersection of two lists",
    "converts a Roman numeral to an integer", "implements a stack class", "reverses a linked list",
    "computes the sum of the digits of a number", "chunks a list into pieces of size n",
    "returns the most common element in a list", "checks whether parentheses are balanced",
    "implements bubble sort", "computes the power set of a set", "counts the lines in a file",
]

CODE_TEMPLATES = [
    "Write a Python function that {task}.",
    "Write a Python function that {task}. Include a docstring.",
    "Write a JavaScript function that {task}.",
    "Show me how to write a function in Python that {task}, with an example.",
    "Write a Python function that {task}, and explain how it works.",
]

SNIPPETS = [
    "def add(a, b):\n    return a + b",
    "def is_even(n):\n    return n % 2 == 0",
    "def greet(name):\n    print('Hello, ' + name + '!')",
    "numbers = [1, 2, 3, 4, 5]\nsquares = [n * n for n in numbers]\nprint(squares)",
    "def count_words(text):\n    words = text.split()\n    return len(words)",
    "def find_max(items):\n    best = items[0]\n    for item in items:\n        if item > best:\n            best = item\n    return best",
    "with open('data.txt') as f:\n    for line in f:\n        print(line.strip())",
    "def factorial(n):\n    if n == 0:\n        return 1\n    return n * factorial(n - 1)",
    "import random\n\ndef roll_die():\n    return random.randint(1, 6)",
    "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):\n        self.count += 1",
    "def average(values):\n    return sum(values) / len(values)",
    "for i in range(1, 16):\n    if i % 15 == 0:\n        print('FizzBuzz')\n    elif i % 3 == 0:\n        print('Fizz')\n    elif i % 5 == 0:\n        print('Buzz')\n    else:\n        print(i)",
    "def reverse_words(sentence):\n    return ' '.join(reversed(sentence.split()))",
    "data = {'apple': 3, 'banana': 5}\nfor key, value in data.items():\n    print(key, value)",
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
    "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32",
    "def unique(items):\n    seen = set()\n    out = []\n    for x in items:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out",
    "def divide(a, b):\n    return a / b\n\nprint(divide(10, 0))",
    "def get_last(items):\n    return items[len(items)]",
    "def total(prices):\n    result = 0\n    for p in prices:\n        result =+ p\n    return result",
]

SNIPPET_TEMPLATES = [
    "Explain what the following code does:\n\n```python\n{code}\n```",
    "Add a docstring and type hints to this code:\n\n```python\n{code}\n```",
    "Is there a bug in this code? If so, fix it.\n\n```python\n{code}\n```",
    "Rewrite this code to be more readable:\n\n```python\n{code}\n```",
    "Write a unit test for this code:\n\n```python\n{code}\n```",
]

PARAGRAPHS = [
    "The city council met on Tuesday to discuss the new bicycle lanes planned for the town centre. "
    "Supporters argued that the lanes would reduce traffic and make the streets safer for children, "
    "while some shop owners worried that removing parking spaces would keep customers away. "
    "The council agreed to run a six-month trial before making a final decision.",
    "Honey bees live in colonies of tens of thousands of workers, a few hundred drones and a single queen. "
    "Workers gather nectar and pollen, build the wax comb and care for the young. "
    "The queen lays up to two thousand eggs a day during the summer, and the colony survives the winter "
    "by clustering together and eating the honey it stored.",
    "Our quarterly results show revenue growth of twelve percent compared with the same period last year. "
    "The increase came mainly from online sales, which grew by thirty percent, while sales in physical stores "
    "remained flat. Operating costs rose because of higher shipping prices, so profit grew more slowly than revenue.",
    "Regular exercise has many benefits beyond weight control. It strengthens the heart, improves mood, "
    "helps people sleep better and lowers the risk of several chronic diseases. Experts recommend at least "
    "150 minutes of moderate activity per week, such as brisk walking or cycling.",
    "The library will close for renovation from the first of June until the end of August. During this time, "
    "books can be returned at the community centre, and a small selection of popular titles will be available "
    "there for borrowing. Online services, including e-books and audiobooks, will continue as normal.",
    "The Great Barrier Reef is the largest coral reef system in the world, stretching over two thousand "
    "kilometres along the coast of Australia. It is home to thousands of species of fish, corals and other "
    "marine life. Rising sea temperatures have caused several mass bleaching events in recent years.",
    "To reset your password, open the login page and click on the link that says 'Forgot password'. "
    "Enter the email address associated with your account, and we will send you a link that is valid for one hour. "
    "If you do not receive the email, check your spam folder or contact our support team.",
    "The first computers filled entire rooms and used thousands of vacuum tubes, which often failed and had to be "
    "replaced. The invention of the transistor in 1947 made computers smaller, faster and more reliable. "
    "Later, integrated circuits placed many transistors on a single chip, which led to personal computers.",
    "Maria started her bakery in a small shop with one oven and a handful of recipes from her grandmother. "
    "At first, only neighbours came, but word spread quickly about her bread and cinnamon rolls. "
    "Five years later, the bakery has three locations and employs twenty people.",
    "Sleep plays an important role in memory. During deep sleep, the brain replays experiences from the day "
    "and strengthens the connections that form long-term memories. People who sleep poorly often find it harder "
    "to concentrate and to learn new information.",
    "The new smartphone has a larger screen, a faster processor and a camera that performs better in low light. "
    "Its battery lasts about a day and a half with normal use. However, it is more expensive than the previous model "
    "and no longer includes a charger in the box.",
    "Volcanoes form where molten rock, called magma, rises through the Earth's crust. When pressure builds up, "
    "the magma can erupt as lava, ash and gas. Some volcanoes erupt explosively, while others release lava slowly "
    "over long periods of time.",
    "The project team agreed to move the release date by two weeks. Testing revealed several problems with the "
    "payment system that must be fixed before launch. The marketing campaign will start one week before the new "
    "date, and customers who pre-ordered will receive a discount code as an apology.",
    "Water covers about seventy percent of the Earth's surface, but only a small fraction of it is fresh water "
    "that people can drink. Most fresh water is frozen in glaciers and ice caps. Protecting rivers, lakes and "
    "groundwater is therefore essential for the health of people and ecosystems.",
    "In the story, a young girl finds a map in her grandfather's attic. The map leads her through the forest "
    "behind the village to an old stone bridge, where she discovers a box of letters. The letters reveal that "
    "her grandfather had once been a famous explorer.",
    "Electric cars are becoming more popular as battery prices fall and charging stations become more common. "
    "They produce no exhaust emissions and are cheaper to run than petrol cars. Critics point out that producing "
    "batteries requires a lot of energy and rare materials.",
    "The museum's new exhibition presents tools, jewellery and pottery from ancient Egypt. Visitors can see "
    "a reconstructed tomb and learn how hieroglyphs were written. The exhibition is open every day except Monday, "
    "and entry is free for children under twelve.",
    "Learning a musical instrument takes patience. Beginners often practise for short periods every day rather "
    "than for many hours once a week, because regular practice builds muscle memory. Many teachers also recommend "
    "recording yourself to hear your progress.",
    "Remote work has changed how many companies operate. Employees save time on commuting and often report a better "
    "balance between work and family life. On the other hand, some people feel isolated, and teams must put more "
    "effort into communication.",
    "The recipe calls for two cups of flour, one cup of sugar, two eggs and a cup of milk. Mix the dry ingredients "
    "first, then add the eggs and milk and stir until the batter is smooth. Bake for thirty minutes at 180 degrees "
    "Celsius, or until a knife inserted in the centre comes out clean.",
    "A hurricane is a large, rotating storm that forms over warm ocean water. As warm, moist air rises, it creates "
    "an area of low pressure that draws in more air. Hurricanes bring strong winds, heavy rain and storm surges "
    "that can flood coastal areas.",
    "The software update fixes a bug that caused the application to crash when opening large files. It also "
    "improves start-up time and adds a dark mode. Users are encouraged to install the update as soon as possible, "
    "as it also contains important security fixes.",
    "Bread is one of the oldest prepared foods. Archaeologists have found evidence of bread made more than fourteen "
    "thousand years ago. Early bread was flat and made from wild grains, and leavened bread became common after "
    "people learned to use yeast.",
    "Our hiking group will meet at the train station at eight o'clock on Saturday. The trail is about twelve "
    "kilometres long and includes a steep climb to the lookout point. Please bring water, lunch, sturdy shoes "
    "and a rain jacket, as the weather in the mountains can change quickly.",
]

TEXT_TEMPLATES = [
    "Summarize the following text in two sentences:\n\n{text}",
    "Summarize this:\n\n{text}",
    "Rewrite the following text in a more formal tone:\n\n{text}",
    "List the key points of this text:\n\n{text}",
    "Give this text a title:\n\n{text}",
    "Rewrite the following text so that a child can understand it:\n\n{text}",
    "Write three questions about the following text:\n\n{text}",
    "Shorten this text to one sentence:\n\n{text}",
]

SHORT_QUESTIONS = [
    "What is the capital of France?", "How many days are there in a leap year?",
    "What is the boiling point of water?", "Who wrote Romeo and Juliet?", "What is the largest planet in our solar system?",
    "How many continents are there?", "What is the chemical symbol for gold?", "What language is spoken in Brazil?",
    "How many legs does a spider have?", "What is the tallest mountain in the world?",
    "What is the square root of 144?", "Who painted the Mona Lisa?", "What is 15 multiplied by 4?",
    "Which ocean is the largest?", "What is the freezing point of water in Fahrenheit?",
    "How many minutes are in a day?", "What is the smallest prime number?", "What gas do plants absorb?",
    "Hello! How are you today?", "Can you help me with my homework?", "What can you do?",
    "Tell me a joke.", "What is your name?", "Recommend a good book to read.",
]


@dataclass(frozen=True)
class Prompt:
    kind: str  # chat, howto, creative, code, text
    text: str
    heldout: bool

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.text}]


def is_heldout(text: str) -> bool:
    """Stable split: a prompt's fate depends on its text only."""
    return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16) % 100 < HELDOUT_PERCENT


def all_prompts() -> list[tuple[str, str]]:
    """Every (kind, text) the templates can make, in a fixed order."""
    out: list[tuple[str, str]] = []
    out += [("chat", t.format(x=x)) for t, x in itertools.product(EXPLAIN_TEMPLATES, TOPICS)]
    out += [("chat", q) for q in SHORT_QUESTIONS]
    out += [("howto", t.format(y=y)) for t, y in itertools.product(HOWTO_TEMPLATES, ACTIVITIES)]
    out += [("creative", t.format(z=z)) for t, z in itertools.product(CREATIVE_TEMPLATES, THEMES)]
    out += [("creative", f"Write a short email to {who} about {what}.") for who, what in EMAILS]
    out += [("creative", f"Write a product description for {p}.") for p in PRODUCTS]
    out += [("code", t.format(task=task)) for t, task in itertools.product(CODE_TEMPLATES, CODE_TASKS)]
    out += [("code", t.format(code=c)) for t, c in itertools.product(SNIPPET_TEMPLATES, SNIPPETS)]
    out += [("text", t.format(text=p)) for t, p in itertools.product(TEXT_TEMPLATES, PARAGRAPHS)]
    return out


def build(num_prompts: int | None = None, *, seed: int = SEED) -> list[Prompt]:
    """A deterministic, kind-balanced sample of the corpus (all of it when ``num_prompts`` is None)."""
    pool = all_prompts()
    random.Random(seed).shuffle(pool)
    if num_prompts is not None:
        pool = pool[:num_prompts]
    return [Prompt(kind, text, is_heldout(text)) for kind, text in pool]


def split(prompts: list[Prompt]) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out)."""
    return [p for p in prompts if not p.heldout], [p for p in prompts if p.heldout]
