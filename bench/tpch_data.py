"""TPC-H data for the lineage benchmark: the 8 tables as Parquet, with numpy and pyarrow only.

``generate(out_dir, scale, seed)`` writes ``<table>.parquet`` per table and returns their
paths. The values follow the TPC-H specification's (v3) rules closely enough that all 22
queries return rows at SF 0.01 with the parameters of ``tpch_queries`` (row counts,
key formulas, value ranges, date rules, the word lists of names, types, containers and
comments), but it is not dbgen: its random streams differ, and comments come from a
simplified grammar over the spec's word lists (sliced out of one text pool, as dbgen
does), so answers are not the spec's answer sets.

Every table has one extra column ``_row`` (int64, 0..n-1 in generation order): the row
identity lineage is expressed in. The queries never mention it.

Deviations from the spec, each to keep small scales meaningful:

- At least one supplier's comment holds ``Customer ... Complaints`` and one
  ``Customer ... Recommends`` (the spec's ``SF * 5`` rounds to none below SF 0.1), so
  Q16's NOT IN excludes something.
- Where the spec's partsupp formula repeats a supplier for a part (only below SF 0.01,
  where it is not defined to work), that part gets consecutive suppliers instead.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TABLES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")

MONEY = pa.decimal128(15, 2)

SCHEMAS: dict[str, pa.Schema] = {
    "region": pa.schema([("r_regionkey", pa.int64()), ("r_name", pa.string()), ("r_comment", pa.string()),
                         ("_row", pa.int64())]),
    "nation": pa.schema([("n_nationkey", pa.int64()), ("n_name", pa.string()), ("n_regionkey", pa.int64()),
                         ("n_comment", pa.string()), ("_row", pa.int64())]),
    "supplier": pa.schema([("s_suppkey", pa.int64()), ("s_name", pa.string()), ("s_address", pa.string()),
                           ("s_nationkey", pa.int64()), ("s_phone", pa.string()), ("s_acctbal", MONEY),
                           ("s_comment", pa.string()), ("_row", pa.int64())]),
    "customer": pa.schema([("c_custkey", pa.int64()), ("c_name", pa.string()), ("c_address", pa.string()),
                           ("c_nationkey", pa.int64()), ("c_phone", pa.string()), ("c_acctbal", MONEY),
                           ("c_mktsegment", pa.string()), ("c_comment", pa.string()), ("_row", pa.int64())]),
    "part": pa.schema([("p_partkey", pa.int64()), ("p_name", pa.string()), ("p_mfgr", pa.string()),
                       ("p_brand", pa.string()), ("p_type", pa.string()), ("p_size", pa.int32()),
                       ("p_container", pa.string()), ("p_retailprice", MONEY), ("p_comment", pa.string()),
                       ("_row", pa.int64())]),
    "partsupp": pa.schema([("ps_partkey", pa.int64()), ("ps_suppkey", pa.int64()), ("ps_availqty", pa.int32()),
                           ("ps_supplycost", MONEY), ("ps_comment", pa.string()), ("_row", pa.int64())]),
    "orders": pa.schema([("o_orderkey", pa.int64()), ("o_custkey", pa.int64()), ("o_orderstatus", pa.string()),
                         ("o_totalprice", MONEY), ("o_orderdate", pa.date32()), ("o_orderpriority", pa.string()),
                         ("o_clerk", pa.string()), ("o_shippriority", pa.int32()), ("o_comment", pa.string()),
                         ("_row", pa.int64())]),
    "lineitem": pa.schema([("l_orderkey", pa.int64()), ("l_partkey", pa.int64()), ("l_suppkey", pa.int64()),
                           ("l_linenumber", pa.int32()), ("l_quantity", MONEY), ("l_extendedprice", MONEY),
                           ("l_discount", MONEY), ("l_tax", MONEY), ("l_returnflag", pa.string()),
                           ("l_linestatus", pa.string()), ("l_shipdate", pa.date32()), ("l_commitdate", pa.date32()),
                           ("l_receiptdate", pa.date32()), ("l_shipinstruct", pa.string()),
                           ("l_shipmode", pa.string()), ("l_comment", pa.string()), ("_row", pa.int64())]),
}

REGIONS = ("AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST")
NATIONS = (  # (name, regionkey), nationkey = position: the spec's fixed table
    ("ALGERIA", 0), ("ARGENTINA", 1), ("BRAZIL", 1), ("CANADA", 1), ("EGYPT", 4), ("ETHIOPIA", 0),
    ("FRANCE", 3), ("GERMANY", 3), ("INDIA", 2), ("INDONESIA", 2), ("IRAN", 4), ("IRAQ", 4), ("JAPAN", 2),
    ("JORDAN", 4), ("KENYA", 0), ("MOROCCO", 0), ("MOZAMBIQUE", 0), ("PERU", 1), ("CHINA", 2),
    ("ROMANIA", 3), ("SAUDI ARABIA", 4), ("VIETNAM", 2), ("RUSSIA", 3), ("UNITED KINGDOM", 3),
    ("UNITED STATES", 1),
)
COLORS = (
    "almond", "antique", "aquamarine", "azure", "beige", "bisque", "black", "blanched", "blue", "blush",
    "brown", "burlywood", "burnished", "chartreuse", "chiffon", "chocolate", "coral", "cornflower",
    "cornsilk", "cream", "cyan", "dark", "deep", "dim", "dodger", "drab", "firebrick", "floral", "forest",
    "frosted", "gainsboro", "ghost", "goldenrod", "green", "grey", "honeydew", "hot", "indian", "ivory",
    "khaki", "lace", "lavender", "lawn", "lemon", "light", "lime", "linen", "magenta", "maroon", "medium",
    "metallic", "midnight", "mint", "misty", "moccasin", "navajo", "navy", "olive", "orange", "orchid",
    "pale", "papaya", "peach", "peru", "pink", "plum", "powder", "puff", "purple", "red", "rose", "rosy",
    "royal", "saddle", "salmon", "sandy", "seashell", "sienna", "sky", "slate", "smoke", "snow", "spring",
    "steel", "tan", "thistle", "tomato", "turquoise", "violet", "wheat", "white", "yellow",
)
TYPE_SYLLABLES = (("STANDARD", "SMALL", "MEDIUM", "LARGE", "ECONOMY", "PROMO"),
                  ("ANODIZED", "BURNISHED", "PLATED", "POLISHED", "BRUSHED"),
                  ("TIN", "NICKEL", "BRASS", "STEEL", "COPPER"))
CONTAINER_SYLLABLES = (("SM", "LG", "MED", "JUMBO", "WRAP"),
                       ("CASE", "BOX", "BAG", "JAR", "PKG", "PACK", "CAN", "DRUM"))
SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "MACHINERY", "HOUSEHOLD")
PRIORITIES = ("1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW")
INSTRUCTIONS = ("DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN")
MODES = ("REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB")

# The comment grammar's word lists (spec 4.2.2.13), the first words of nouns and
# adjectives weighted up as in dbgen's dists.dss, so "special ... requests" is common.
NOUNS = ("packages", "requests", "accounts", "deposits", "foxes", "ideas", "theodolites", "pinto beans",
         "instructions", "dependencies", "excuses", "platelets", "asymptotes", "courts", "dolphins",
         "multipliers", "sauternes", "warthogs", "frets", "dinos", "attainments", "somas", "Tiresias",
         "patterns", "forges", "braids", "hockey players", "frays", "warhorses", "dugouts", "notornis",
         "epitaphs", "pearls", "tithes", "waters", "orbits", "gifts", "sheaves", "depths", "sentiments",
         "decoys", "realms", "pains", "grouches", "escapades")
VERBS = ("sleep", "wake", "are", "cajole", "haggle", "nag", "use", "boost", "affix", "detect", "integrate",
         "maintain", "nod", "was", "lose", "sublate", "solve", "thrash", "promise", "engage", "hinder",
         "print", "x-ray", "breach", "eat", "grow", "impress", "mold", "poach", "serve", "run", "dazzle",
         "snooze", "doze", "unwind", "kindle", "play", "hang", "believe", "doubt")
ADJECTIVES = ("special", "pending", "unusual", "express", "furious", "sly", "careful", "blithe", "quick",
              "fluffy", "slow", "quiet", "ruthless", "thin", "close", "dogged", "daring", "brave", "stealthy",
              "permanent", "enticing", "idle", "busy", "regular", "final", "ironic", "even", "bold", "silent")
ADVERBS = ("sometimes", "always", "never", "furiously", "slyly", "carefully", "blithely", "quickly",
           "fluffily", "slowly", "quietly", "ruthlessly", "thinly", "closely", "doggedly", "daringly",
           "bravely", "stealthily", "permanently", "enticingly", "idly", "busily", "regularly", "finally",
           "ironically", "evenly", "boldly", "silently")
PREPOSITIONS = ("about", "above", "according to", "across", "after", "against", "along", "alongside of",
                "among", "around", "at", "atop", "before", "behind", "beneath", "beside", "besides", "between",
                "beyond", "by", "despite", "during", "except", "for", "from", "in place of", "inside",
                "instead of", "into", "near", "of", "on", "outside", "over", "past", "since", "through",
                "throughout", "to", "toward", "under", "until", "up", "upon", "without", "with", "within")
TERMINATORS = (".", ";", ":", "?", "!", "--")
HEAVY_WORDS = 4  # the first 4 nouns and adjectives are drawn 10x as often

# The default seed: one whose data gives Q17 and Q19 (which select a few lineitems at SF 0.01) rows
# at SF 0.01 and 0.005; most seeds do, some leave one of them NULL.
SEED = 11

START = dt.date(1992, 1, 1)
CURRENT = dt.date(1995, 6, 17)
END = dt.date(1998, 12, 31)
EPOCH = dt.date(1970, 1, 1)
ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,", dtype="S1")


def generate(out_dir: str | Path, scale: float = 0.01, seed: int = SEED) -> dict[str, Path]:
    """Write the 8 tables as ``out_dir/<table>.parquet``; the same ``scale`` and ``seed`` give the same bytes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables = build(scale, seed)
    paths = {}
    for name in TABLES:
        paths[name] = out / f"{name}.parquet"
        pq.write_table(tables[name], paths[name])
    return paths


def build(scale: float, seed: int) -> dict[str, pa.Table]:
    """The 8 tables in memory, in dependency order (lineitem's prices need part, orders' totals need lineitem)."""
    rng = np.random.default_rng(seed)
    counts = table_sizes(scale)
    pool = _text_pool(rng, 50_000)
    tables = {"region": _region(rng, pool), "nation": _nation(rng, pool)}
    tables["supplier"] = _supplier(rng, pool, counts["supplier"])
    tables["customer"] = _customer(rng, pool, counts["customer"])
    tables["part"] = _part(rng, pool, counts["part"])
    tables["partsupp"] = _partsupp(rng, pool, counts["part"], counts["supplier"])
    tables["orders"], tables["lineitem"] = _orders_lineitem(rng, pool, counts, tables["part"])
    return tables


def table_sizes(scale: float) -> dict[str, int]:
    """Base row counts of the spec (lineitem and partsupp follow from orders and part)."""
    sizes = {"supplier": round(10_000 * scale), "customer": round(150_000 * scale),
             "part": round(200_000 * scale), "orders": round(1_500_000 * scale)}
    if sizes["supplier"] < 4:
        raise ValueError(f"scale {scale} gives fewer than the 4 suppliers every part needs")
    return sizes


def money(cents: np.ndarray) -> pa.Array:
    """decimal(15,2) from integer cents, exactly: the 128-bit little-endian words built directly."""
    cents = np.asarray(cents, dtype=np.int64)
    words = np.empty((len(cents), 2), dtype=np.int64)
    words[:, 0] = cents
    words[:, 1] = np.where(cents < 0, -1, 0)
    return pa.Array.from_buffers(MONEY, len(cents), [None, pa.py_buffer(words.tobytes())])


def _dates(days_since_start: np.ndarray) -> pa.Array:
    return pa.array((days_since_start + (START - EPOCH).days).astype(np.int32), pa.date32())


def _table(name: str, columns: dict[str, object]) -> pa.Table:
    """A table of ``name``'s schema; ``_row`` is added here so no generator forgets it."""
    n = len(next(iter(columns.values())))
    columns = {**columns, "_row": np.arange(n, dtype=np.int64)}
    schema = SCHEMAS[name]
    return pa.table([pa.array(columns[f.name], f.type) if not isinstance(columns[f.name], pa.Array)
                     else columns[f.name] for f in schema], schema=schema)


def _pick(rng: np.random.Generator, words: tuple[str, ...], n: int) -> np.ndarray:
    return np.array(words, dtype=object)[rng.integers(0, len(words), n)]


def _weighted(rng: np.random.Generator, words: tuple[str, ...], n: int) -> np.ndarray:
    weights = np.array([10.0 if i < HEAVY_WORDS else 1.0 for i in range(len(words))])
    return np.array(words, dtype=object)[rng.choice(len(words), n, p=weights / weights.sum())]


def _text_pool(rng: np.random.Generator, sentences: int) -> str:
    """dbgen's text pool: sentences of the spec's grammar, from which comments are sliced.

    Sentence shape: [adverb] adjective noun verb [adverb] [preposition the adjective noun] terminator,
    which keeps "special ... requests" and "Customer"-free text as common as in dbgen.
    """
    adverb1, adverb2 = _pick(rng, ADVERBS, sentences), _pick(rng, ADVERBS, sentences)
    adj1, adj2 = _weighted(rng, ADJECTIVES, sentences), _weighted(rng, ADJECTIVES, sentences)
    noun1, noun2 = _weighted(rng, NOUNS, sentences), _weighted(rng, NOUNS, sentences)
    verb, prep = _pick(rng, VERBS, sentences), _pick(rng, PREPOSITIONS, sentences)
    term = _pick(rng, TERMINATORS, sentences)
    lead, tail, phrase = rng.random(sentences) < 0.5, rng.random(sentences) < 0.5, rng.random(sentences) < 0.5
    parts = []
    for i in range(sentences):
        words = [adverb1[i]] if lead[i] else []
        words += [adj1[i], noun1[i], verb[i]]
        words += [adverb2[i]] if tail[i] else []
        words += [prep[i], "the", adj2[i], noun2[i]] if phrase[i] else []
        parts.append(" ".join(words) + term[i])
    return " ".join(parts)


def _comments(rng: np.random.Generator, pool: str, n: int, low: int, high: int) -> list[str]:
    """Random slices of the pool, ``low``..``high`` characters long, stripped of edge spaces like dbgen's."""
    lengths = rng.integers(low, high + 1, n)
    starts = rng.integers(0, len(pool) - high, n)
    return [pool[s:s + k].strip() for s, k in zip(starts.tolist(), lengths.tolist())]


def _vstrings(rng: np.random.Generator, n: int, low: int, high: int) -> list[str]:
    """Random alphanumeric strings (addresses), ``low``..``high`` characters."""
    lengths = rng.integers(low, high + 1, n)
    chars = ALPHABET[rng.integers(0, len(ALPHABET), int(lengths.sum()))].tobytes().decode()
    ends = np.cumsum(lengths).tolist()
    return [chars[e - k:e] for e, k in zip(ends, lengths.tolist())]


def _phones(rng: np.random.Generator, nationkeys: np.ndarray) -> list[str]:
    """Spec phone numbers: the country code is nationkey + 10, which Q22 reads."""
    n = len(nationkeys)
    a, b, c = rng.integers(100, 1000, n), rng.integers(100, 1000, n), rng.integers(1000, 10000, n)
    return [f"{k + 10}-{x}-{y}-{z}" for k, x, y, z in zip(nationkeys.tolist(), a.tolist(), b.tolist(), c.tolist())]


def _region(rng: np.random.Generator, pool: str) -> pa.Table:
    return _table("region", {"r_regionkey": np.arange(5), "r_name": list(REGIONS),
                             "r_comment": _comments(rng, pool, 5, 31, 115)})


def _nation(rng: np.random.Generator, pool: str) -> pa.Table:
    return _table("nation", {"n_nationkey": np.arange(len(NATIONS)), "n_name": [n for n, _ in NATIONS],
                             "n_regionkey": [r for _, r in NATIONS], "n_comment": _comments(rng, pool, 25, 31, 114)})


def _supplier(rng: np.random.Generator, pool: str, n: int) -> pa.Table:
    keys = np.arange(1, n + 1)
    nations = rng.integers(0, 25, n)
    comments = _comments(rng, pool, n, 25, 100)
    flagged = rng.choice(n, 2 * max(1, round(5 * n / 10_000)), replace=False)
    half = len(flagged) // 2
    for i, word in [(i, "Complaints") for i in flagged[:half]] + [(i, "Recommends") for i in flagged[half:]]:
        comments[i] = _with_customer_note(rng, comments[i], word)
    return _table("supplier", {
        "s_suppkey": keys, "s_name": [f"Supplier#{k:09d}" for k in keys.tolist()],
        "s_address": _vstrings(rng, n, 10, 40), "s_nationkey": nations, "s_phone": _phones(rng, nations),
        "s_acctbal": money(rng.integers(-99_999, 1_000_000, n)), "s_comment": comments})


def _with_customer_note(rng: np.random.Generator, comment: str, word: str) -> str:
    """The spec's "Customer%Complaints" (or Recommends) note at a random place, the comment's length kept."""
    note = f"Customer {ADJECTIVES[int(rng.integers(0, len(ADJECTIVES)))]} {word}"
    at = int(rng.integers(0, max(1, len(comment) - len(note))))
    return comment[:at] + note + comment[at + len(note):]


def _customer(rng: np.random.Generator, pool: str, n: int) -> pa.Table:
    keys = np.arange(1, n + 1)
    nations = rng.integers(0, 25, n)
    return _table("customer", {
        "c_custkey": keys, "c_name": [f"Customer#{k:09d}" for k in keys.tolist()],
        "c_address": _vstrings(rng, n, 10, 40), "c_nationkey": nations, "c_phone": _phones(rng, nations),
        "c_acctbal": money(rng.integers(-99_999, 1_000_000, n)), "c_mktsegment": _pick(rng, SEGMENTS, n),
        "c_comment": _comments(rng, pool, n, 29, 116)})


def retail_cents(partkeys: np.ndarray) -> np.ndarray:
    """The spec's p_retailprice formula, in cents."""
    return 90_000 + (partkeys // 10) % 20_001 + 100 * (partkeys % 1_000)


def _part(rng: np.random.Generator, pool: str, n: int) -> pa.Table:
    keys = np.arange(1, n + 1)
    colors = np.array(COLORS, dtype=object)[np.argsort(rng.random((n, len(COLORS))), axis=1)[:, :5]]
    mfgr, brand = rng.integers(1, 6, n), rng.integers(1, 6, n)
    types = [_pick(rng, s, n) for s in TYPE_SYLLABLES]
    containers = [_pick(rng, s, n) for s in CONTAINER_SYLLABLES]
    return _table("part", {
        "p_partkey": keys, "p_name": [" ".join(c) for c in colors],
        "p_mfgr": [f"Manufacturer#{m}" for m in mfgr.tolist()],
        "p_brand": [f"Brand#{m}{b}" for m, b in zip(mfgr.tolist(), brand.tolist())],
        "p_type": [" ".join(t) for t in zip(*types)], "p_size": rng.integers(1, 51, n),
        "p_container": [" ".join(c) for c in zip(*containers)], "p_retailprice": money(retail_cents(keys)),
        "p_comment": _comments(rng, pool, n, 5, 22)})


def part_suppliers(partkeys: np.ndarray, suppliers: int) -> np.ndarray:
    """The 4 suppliers of each part (one row per part): the spec's formula, consecutive where it repeats one."""
    i = np.arange(4)[None, :]
    pk = partkeys[:, None]
    spec = (pk + i * (suppliers // 4 + (pk - 1) // suppliers)) % suppliers + 1
    consecutive = (pk + i) % suppliers + 1
    sorted_spec = np.sort(spec, axis=1)
    repeats = (sorted_spec[:, 1:] == sorted_spec[:, :-1]).any(axis=1)
    return np.where(repeats[:, None], consecutive, spec)


def _partsupp(rng: np.random.Generator, pool: str, parts: int, suppliers: int) -> pa.Table:
    partkeys = np.arange(1, parts + 1)
    n = 4 * parts
    return _table("partsupp", {
        "ps_partkey": np.repeat(partkeys, 4), "ps_suppkey": part_suppliers(partkeys, suppliers).ravel(),
        "ps_availqty": rng.integers(1, 10_000, n), "ps_supplycost": money(rng.integers(100, 100_001, n)),
        "ps_comment": _comments(rng, pool, n, 49, 198)})


def _orders_lineitem(rng: np.random.Generator, pool: str, counts: dict[str, int],
                     part: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Orders and their 1..7 lineitems, with the spec's date, flag, status and price rules."""
    n = counts["orders"]
    idx = np.arange(n)
    orderkeys = (idx // 8) * 32 + idx % 8 + 1  # the spec's sparse keys: 8 of every 32 used
    eligible = np.arange(1, counts["customer"] + 1)
    eligible = eligible[eligible % 3 != 0]  # a third of the customers never order
    custkeys = eligible[rng.integers(0, len(eligible), n)]
    orderdates = rng.integers(0, (END - START).days - 151 + 1, n)

    lines = rng.integers(1, 8, n)
    m = int(lines.sum())
    owner = np.repeat(idx, lines)
    linenumber = np.arange(m) - np.repeat(np.cumsum(lines) - lines, lines) + 1
    partkeys = rng.integers(1, counts["part"] + 1, m)
    suppkeys = part_suppliers(partkeys, counts["supplier"])[np.arange(m), rng.integers(0, 4, m)]
    quantity = rng.integers(1, 51, m)
    extended = quantity * retail_cents(partkeys)
    discount, tax = rng.integers(0, 11, m), rng.integers(0, 9, m)
    ship = orderdates[owner] + rng.integers(1, 122, m)
    commit = orderdates[owner] + rng.integers(30, 91, m)
    receipt = ship + rng.integers(1, 31, m)
    current = (CURRENT - START).days
    returnflag = np.where(receipt <= current, np.where(rng.random(m) < 0.5, "R", "A"), "N")
    linestatus = np.where(ship > current, "O", "F")

    # dbgen's integer arithmetic for the order total: truncating divisions per line.
    line_total = (extended * (100 - discount)) // 100 * (100 + tax) // 100
    totals = np.bincount(owner, weights=line_total, minlength=n).astype(np.int64)
    open_lines = np.bincount(owner, weights=(linestatus == "O"), minlength=n)
    status = np.where(open_lines == lines, "O", np.where(open_lines == 0, "F", "P"))

    orders = _table("orders", {
        "o_orderkey": orderkeys, "o_custkey": custkeys, "o_orderstatus": status, "o_totalprice": money(totals),
        "o_orderdate": _dates(orderdates), "o_orderpriority": _pick(rng, PRIORITIES, n),
        "o_clerk": [f"Clerk#{c:09d}" for c in rng.integers(1, max(1, round(counts["orders"] / 1500)) + 1, n).tolist()],
        "o_shippriority": np.zeros(n, dtype=np.int32), "o_comment": _comments(rng, pool, n, 19, 78)})
    lineitem = _table("lineitem", {
        "l_orderkey": orderkeys[owner], "l_partkey": partkeys, "l_suppkey": suppkeys, "l_linenumber": linenumber,
        "l_quantity": money(quantity * 100), "l_extendedprice": money(extended), "l_discount": money(discount),
        "l_tax": money(tax), "l_returnflag": returnflag, "l_linestatus": linestatus, "l_shipdate": _dates(ship),
        "l_commitdate": _dates(commit), "l_receiptdate": _dates(receipt),
        "l_shipinstruct": _pick(rng, INSTRUCTIONS, m), "l_shipmode": _pick(rng, MODES, m),
        "l_comment": _comments(rng, pool, m, 10, 43)})
    return orders, lineitem
