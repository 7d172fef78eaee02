"""Static tables' names: short where they are unique, told apart where two share one, and found back."""

from __future__ import annotations

import pytest

from headwater.core.rid import table_dataset, table_rid
from headwater.query.address import parse_source
from headwater.query.datasets import Tables, display_names, names_table, short_name
from headwater.query.errors import LineageError

V1 = table_dataset("file:/data/v1/sites.parquet")
V2 = table_dataset("file:/data/v2/sites.parquet")
PROD = table_dataset("catalog:spark_catalog.prod.customers")
STAGING = table_dataset("catalog:spark_catalog.staging.customers")
LOCAL = table_dataset("query:orders/customers#4")
JOINED = table_dataset("file:/d/a.parquet,file:/d/b")


def test_a_table_is_shown_by_its_short_name_unless_an_answer_holds_another_of_that_name():
    assert [short_name(d) for d in (V1, PROD, LOCAL, JOINED)] == ["sites", "customers", "customers", "a+b"]
    assert display_names([V1, "kafka:orders", None, "parquet:/sink"]) == {V1: "sites"}
    assert display_names([V1, V2, V1]) == {V1: "sites@v1/sites.parquet", V2: "sites@v2/sites.parquet"}
    assert display_names([PROD, STAGING, LOCAL]) == {PROD: "customers@prod.customers",
                                             STAGING: "customers@staging.customers",
                                             LOCAL: "customers@customers#4"}
    # A path that ends another one's is told apart by its whole identity.
    deeper = table_dataset("file:/x/data/v1/sites.parquet")
    names = display_names([V1, deeper])
    assert names == {V1: "sites@file:/data/v1/sites.parquet", deeper: "sites@x/data/v1/sites.parquet"}
    assert Tables({V1: {}, deeper: {}}).split(f"{names[V1]}:s0") == (V1, "s0")
    assert Tables({V1: {}, deeper: {}}).split(f"{names[deeper]}:s0") == (deeper, "s0")


def test_every_form_of_a_name_finds_its_table_and_no_other():
    for name in ("sites", "sites@v1/sites.parquet", "sites@sites.parquet", "file:/data/v1/sites.parquet", V1):
        assert names_table(name, V1), name
    assert names_table("dims", V1, alias="dims") and names_table("dims@v1/sites.parquet", V1, alias="dims")
    for name in ("sites@v2/sites.parquet", "sites@1/sites.parquet", "site", "sites@", "v1/sites.parquet", "kafka:x"):
        assert not names_table(name, V1), name
    assert not names_table("sites", "kafka:sites") and not names_table("sites", None)


def test_an_address_names_its_tables_row_and_a_shared_short_name_is_refused_with_the_names_that_tell_apart():
    tables = Tables({V1: {"short_name": "sites"}, V2: {"short_name": "sites"}, PROD: {"short_name": "clients"},
                     "kafka:orders": {}})
    assert tables.find("sites@v2/sites.parquet") == V2 and tables.find("clients") == PROD
    assert tables.find("customers") == PROD and tables.find("nothing") is None
    with pytest.raises(LineageError, match=r"2 static tables are called 'sites': name one of "
                                           r"sites@v1/sites.parquet, sites@v2/sites.parquet"):
        tables.find("sites")
    assert parse_source("table:sites@v1/sites.parquet:s0", tables) == table_rid("file:/data/v1/sites.parquet", "s0")
    assert parse_source("table:clients:7:x", tables) == table_rid("catalog:spark_catalog.prod.customers", "7:x")
    with pytest.raises(LineageError, match="called 'sites'"):
        parse_source("table:sites:s0", tables)
    # A name no described table has is taken as a table's identity.
    assert parse_source("table:other:1", tables) == table_rid("other", "1") == parse_source("table:other:1")
