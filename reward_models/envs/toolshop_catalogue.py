"""What a shop task is made of: the catalogue's words (products, colours, materials, brands, item ids), the
difficulty levels, and the scenario (catalogue and goal) each task seed generates; also the text holding every word
the shop can show, for training a tokenizer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from dataclasses import dataclass
from typing import Any

from reward_models.envs.toolshop_tools import TOOLS, tool_json

PRODUCTS = (
    "mug", "lamp", "kettle", "backpack", "scarf", "blanket", "candle", "notebook", "bottle", "pillow", "towel",
    "umbrella", "wallet", "jacket", "sweater", "teapot", "basket", "clock", "vase", "bowl", "plate", "glove", "hat",
    "belt", "sock", "shirt", "chair", "stool", "desk", "shelf", "mirror", "rug", "curtain", "apron", "ladle",
    "skillet", "whisk", "grater", "colander", "cushion", "duvet", "hammock", "lantern", "flask", "thermos", "tumbler",
    "pitcher", "saucepan", "cardigan", "poncho", "sandal", "slipper", "boot", "sneaker", "beanie", "headband",
    "bracelet", "necklace", "earring", "keychain", "satchel", "suitcase", "duffel", "tote", "pouch", "planner",
    "journal", "pencil", "marker", "crayon", "stapler", "binder", "folder", "easel", "canvas", "palette", "brush",
    "sponge", "bucket", "broom", "mop", "doormat", "coaster", "napkin", "tablecloth", "placemat", "teacup", "saucer",
    "spatula", "tongs", "blender", "toaster", "speaker", "headphones", "keyboard", "mouse", "monitor", "charger",
    "cable", "tripod", "helmet", "kayak", "paddle", "tent", "sleeping bag", "compass", "whistle", "frisbee", "kite",
    "yoyo", "puzzle", "jigsaw", "domino", "marble", "skateboard", "scooter", "bicycle", "raincoat", "windbreaker",
    "anorak", "parka", "blazer", "waistcoat", "tunic", "kimono", "sarong", "shawl", "mitten", "legging", "trouser",
    "shorts", "skirt", "dress", "hoodie", "vest", "tie", "bowtie", "cufflink", "brooch", "pendant", "anklet", "tiara",
    "locket", "watch", "sunglasses", "goggles", "visor", "backgammon", "chessboard", "abacus", "globe", "telescope",
    "microscope", "magnifier", "binoculars", "flashlight", "torch", "radio", "turntable", "cassette", "camera",
    "projector", "printer", "scanner", "router", "joystick", "gamepad", "tablet", "laptop", "stylus", "webcam",
    "microphone", "amplifier", "ukulele", "guitar", "banjo", "violin", "cello", "harmonica", "tambourine",
    "xylophone", "metronome", "drum", "cymbal", "flute", "clarinet", "trumpet", "accordion", "bagpipe", "sitar",
    "mandolin", "harp", "oboe", "bassoon", "piccolo", "trombone", "casserole", "ramekin", "terrine", "trivet",
    "carafe", "decanter", "goblet", "chalice", "tankard", "jug", "cauldron", "wok", "griddle", "steamer", "strainer",
    "sieve", "funnel", "mortar", "pestle", "rolling pin", "cleaver", "peeler", "corkscrew", "nutcracker", "timer",
    "thermometer", "scale", "scissors", "tweezers", "comb", "hairbrush", "razor", "toothbrush", "soap dish", "loofah",
    "bathrobe", "flannel", "bathmat", "hamper", "laundry bag",
)  # fmt: skip


COLOURS = (
    "red", "blue", "green", "black", "white", "yellow", "orange", "purple", "pink", "brown", "grey", "silver",
    "golden", "navy", "teal", "olive",
)  # fmt: skip


MATERIALS = (
    "ceramic", "cotton", "wool", "steel", "oak", "pine", "bamboo", "glass", "leather", "linen", "canvas", "copper",
    "plastic", "silk", "denim", "walnut", "marble", "felt", "rubber", "aluminium", "cashmere", "velvet", "suede",
    "tweed", "corduroy", "porcelain", "stoneware", "terracotta", "birch", "cherry", "maple", "mahogany", "teak",
    "bronze", "brass", "pewter", "titanium", "nylon", "polyester", "acrylic", "resin", "cork", "jute", "hemp",
    "rattan", "wicker", "slate", "granite", "enamel", "cast iron",
)  # fmt: skip


BRANDS = (
    "Norvik", "Aldera", "Bramwell", "Castora", "Dunmore", "Elmsworth", "Fennick", "Galloway", "Harrowgate", "Isolde",
    "Juniper", "Kestrel", "Lindqvist", "Marrow", "Nightingale", "Oakhurst", "Pemberton", "Quillon", "Rosewater",
    "Sandhaven", "Thistle", "Umbridge", "Vantoor", "Wexley", "Yarrow", "Zephyrine", "Ashcombe", "Birchley",
    "Coldridge", "Drayfield", "Everhart", "Foxglove", "Greystone", "Hollister", "Ironwood", "Jessamy", "Kingsley",
    "Larkspur", "Moorland", "Northcote", "Ormond", "Penhallow", "Quarrington", "Ravenscroft", "Stillwater", "Tamsin",
    "Underhill", "Valentin", "Whitlock", "Yelverton", "Zanetti", "Abernathy", "Blackthorn", "Crestwood", "Dalgleish",
    "Eastbrook", "Fairweather", "Glenrock", "Hawthorne", "Inglewood", "Jubilee", "Kilbride", "Lochlan",
    "Merriweather", "Nethercott", "Oldfield", "Primrose", "Quenby", "Redmayne", "Southwold", "Trelawney", "Upwood",
    "Verity", "Wolcott", "Yardley",
)  # fmt: skip


def _item_id_pool() -> tuple[str, ...]:
    # Two letters and two digits, like a short SKU. A fixed generator, so the pool (and the policy tokenizer that
    # holds every id as one token) never changes.
    rng = random.Random(20_251_127)
    letters = "abcdefghjkmnpqrstuvwxyz"
    pool: list[str] = []
    seen: set[str] = set()
    while len(pool) < 400:
        code = rng.choice(letters) + rng.choice(letters) + str(rng.randint(10, 99))
        if code not in seen:
            seen.add(code)
            pool.append(code)
    return tuple(pool)


ITEM_IDS = _item_id_pool()


@dataclass(frozen=True)
class Difficulty:
    """How one difficulty level generates tasks."""

    products: int  # distinct product words in the catalogue
    min_colours: int  # colour variants per product
    max_colours: int
    max_goal_items: int  # items the goal asks for (1 or 2)
    cheapest_share: float  # probability that a goal item is "the cheapest <product>"
    shared_words: bool  # whether items may share words (level 1: every item's words are its own)


DIFFICULTIES: dict[int, Difficulty] = {
    1: Difficulty(products=4, min_colours=1, max_colours=1, max_goal_items=1, cheapest_share=0.0, shared_words=False),
    2: Difficulty(products=3, min_colours=2, max_colours=3, max_goal_items=1, cheapest_share=0.0, shared_words=True),
    3: Difficulty(products=3, min_colours=2, max_colours=3, max_goal_items=2, cheapest_share=0.0, shared_words=True),
    4: Difficulty(products=4, min_colours=3, max_colours=4, max_goal_items=2, cheapest_share=0.4, shared_words=True),
}


# Item names are quoted as in the JSON the tools exchange, so that a name is the same tokens in the instruction, in a
# search query and in a search result (a byte-level BPE gives `red` after a quote but ` red` after a space).
SINGLE_GOAL_PHRASES = (
    "Buy {0}, quantity {1}.",
    "Please order {0}, quantity {1}.",
    "I need {0}, quantity {1}. Check out when done.",
)


DOUBLE_GOAL_PHRASES = (
    "Buy {0}, quantity {1}, and {2}, quantity {3}.",
    "Please order {0}, quantity {1}, and {2}, quantity {3}.",
)


@dataclass(frozen=True)
class Item:
    item_id: str
    name: str
    product: str
    colour: str
    material: str
    brand: str
    price: int

    def summary(self) -> dict[str, Any]:
        # Name before id: a causal model reads the name first and then the id it has to copy.
        return {"name": self.name, "id": self.item_id, "price": self.price}

    def details(self) -> dict[str, Any]:
        return {**self.summary(), "colour": self.colour, "material": self.material, "brand": self.brand}


@dataclass(frozen=True)
class GoalItem:
    """One line of the goal: ``quantity`` of the item ``item_id``, asked for by ``phrase`` (its quoted name, or
    ``the cheapest "<product>"``)."""

    item_id: str
    quantity: int
    phrase: str
    cheapest: bool


@dataclass(frozen=True)
class Scenario:
    """Everything a task seed generates: the catalogue and the goal."""

    seed: int
    difficulty: int
    items: tuple[Item, ...]
    goal: tuple[GoalItem, ...]
    instruction: str

    def item(self, item_id: str) -> Item | None:
        return next((item for item in self.items if item.item_id == item_id), None)

    def goal_cart(self) -> dict[str, int]:
        return {line.item_id: line.quantity for line in self.goal}

    def search(self, query: str) -> list[Item]:
        """Items sharing a word with ``query``, in an order fixed by the seed and query but unrelated to relevance."""
        words = set(query.lower().split())
        found = [item for item in self.items if words & set(item.name.split())]
        random.Random(f"{self.seed}:{' '.join(sorted(words))}").shuffle(found)
        return found


@functools.lru_cache(maxsize=1024)
def generate_scenario(seed: int, difficulty: int) -> Scenario:
    """The catalogue and goal of a task; the same seed and difficulty always give the same scenario (immutable, so
    it is cached: a task, its episode and its oracle all ask for it)."""
    level = DIFFICULTIES[difficulty]
    # random.Random(int) is stable across Python versions and platforms, so a seed names the same task forever.
    rng = random.Random(seed * 10 + difficulty)
    products = rng.sample(PRODUCTS, level.products)
    ids = iter(rng.sample(ITEM_IDS, level.products * level.max_colours))
    items: list[Item] = []
    unused_colours = list(COLOURS)
    rng.shuffle(unused_colours)
    for product in products:
        count = rng.randint(level.min_colours, level.max_colours)
        colours = [unused_colours.pop()] if not level.shared_words else rng.sample(COLOURS[:8], count)
        for colour in colours:
            price = rng.randint(2, 99)
            material, brand = rng.choice(MATERIALS), rng.choice(BRANDS)
            items.append(Item(next(ids), f"{colour} {product}", product, colour, material, brand, price))
    # Prices within a product are made distinct so that "the cheapest" always names one item.
    items = _distinct_prices(items, rng)

    goal_count = rng.randint(1, level.max_goal_items)
    goal_products = rng.sample(products, goal_count)
    goal: list[GoalItem] = []
    for product in goal_products:
        variants = [item for item in items if item.product == product]
        quantity = rng.randint(1, 5)
        if len(variants) > 1 and rng.random() < level.cheapest_share:
            target = min(variants, key=lambda item: item.price)
            goal.append(GoalItem(target.item_id, quantity, f'the cheapest "{product}"', cheapest=True))
        else:
            target = rng.choice(variants)
            goal.append(GoalItem(target.item_id, quantity, f'"{target.name}"', cheapest=False))
    if len(goal) == 1:
        instruction = rng.choice(SINGLE_GOAL_PHRASES).format(goal[0].phrase, goal[0].quantity)
    else:
        phrase = rng.choice(DOUBLE_GOAL_PHRASES)
        instruction = phrase.format(goal[0].phrase, goal[0].quantity, goal[1].phrase, goal[1].quantity)
    return Scenario(seed, difficulty, tuple(items), tuple(goal), instruction)


def _distinct_prices(items: list[Item], rng: random.Random) -> list[Item]:
    result: list[Item] = []
    taken: dict[str, set[int]] = {}
    for item in items:
        prices = taken.setdefault(item.product, set())
        price = item.price
        while price in prices:
            price = rng.randint(2, 99)
        prices.add(price)
        result.append(item if price == item.price else dataclasses.replace(item, price=price))
    return result


def vocabulary_corpus() -> list[str]:
    """Text holding every word the shop can show or be asked for (each product in every colour, with materials and
    brands as ``get_item`` shows them, the tool schemas and the instruction phrases), for training a tokenizer whose
    vocabulary does not depend on which tasks the demonstrations happened to draw."""
    lines = [json.dumps(TOOLS), *SINGLE_GOAL_PHRASES, *DOUBLE_GOAL_PHRASES]
    rng = random.Random(0)
    for product in PRODUCTS:
        for colour in COLOURS:
            item = Item(
                rng.choice(ITEM_IDS),
                f"{colour} {product}",
                product,
                colour,
                rng.choice(MATERIALS),
                rng.choice(BRANDS),
                rng.randint(2, 99),
            )
            lines.append(tool_json(item.details()))
            lines.append(f'the cheapest "{product}"')
    return lines
