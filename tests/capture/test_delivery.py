"""Delivery when no broker answers (a free port nobody listens on): spill, breaker, bound.

The broker-kill path with a live stream is in ``test_faults.py``.
"""

import time

from headwater.capture.delivery import DROPPED, SPILLED, Breaker, Delivery, DeliverySettings, Spill
from headwater.deploy.stack import free_port


def test_spill_keeps_messages_in_order_within_its_bound(tmp_path):
    spill = Spill(tmp_path, max_bytes=200)
    assert spill.put("t", b"k1", b"a" * 50) and spill.put("t", None, b"b" * 50)
    assert spill.put("t", b"k3", b"c" * 150) is None  # would pass the bound
    paths = spill.files()
    claimed = [spill.claim(p) for p in paths]
    assert [(topic, key, value[:1]) for _, topic, key, value in claimed] == [("t", b"k1", b"a"), ("t", None, b"b")]
    assert spill.files() == [] and spill.claim(paths[0]) is None  # claimed: nobody else takes it
    spill.release(claimed[1][0])
    assert [spill.claim(p)[3][:1] for p in spill.files()] == [b"b"]
    # A claim whose drainer died is given back after a while.
    assert spill.release_stale(older_than_s=0) == 2 and len(spill.files()) == 2


def test_breaker_lets_one_probe_through_after_its_cooldown(tmp_path):
    breaker = Breaker(tmp_path, cooldown_s=0.3)
    assert breaker.allow()
    breaker.open()
    assert breaker.is_open() and not breaker.allow()
    time.sleep(0.35)
    assert breaker.allow()  # this caller probes ...
    assert not Breaker(tmp_path, 0.3).allow()  # ... everyone else still waits
    breaker.close()
    assert Breaker(tmp_path, 0.3).allow()


def test_unreachable_broker_spills_at_once_after_the_first_try(tmp_path):
    settings = DeliverySettings(f"127.0.0.1:{free_port()}", str(tmp_path), spill_max_bytes=4096,
                                send_timeout_s=2.0, breaker_cooldown_s=60)
    delivery = Delivery(settings)
    started = time.monotonic()
    assert delivery.deliver([("t", b"k", b"x" * 1000), ("t", b"k", b"y" * 1000)]) == [SPILLED, SPILLED]
    first = time.monotonic() - started
    assert first < 5 and delivery.breaker.is_open()
    started = time.monotonic()
    assert delivery.deliver([("t", b"k", b"z" * 1000), ("t", b"k", b"w" * 3000)]) == [SPILLED, DROPPED]
    assert time.monotonic() - started < 0.1  # the open breaker: no wait for the broker
    assert len(delivery.spill.files()) == 3
    assert delivery.drain() == (0, 3)  # still open: nothing tried, nothing lost


def test_nothing_to_send_leaves_the_breaker_alone(tmp_path):
    delivery = Delivery(DeliverySettings(f"127.0.0.1:{free_port()}", str(tmp_path), breaker_cooldown_s=0.2))
    delivery.breaker.open()
    time.sleep(0.25)
    assert delivery.deliver([]) == [] and delivery.drain() == (0, 0)
    assert delivery.breaker.allow()  # still this caller's turn to probe: nobody took it
