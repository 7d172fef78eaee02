"""The keyword arguments every kafka-python client of headwater takes from a ``Config``.

One function, ``connection``, so that no producer, consumer or admin client is made
without the cluster's security settings: ``headwater.adapters.kafka`` passes its result
to each client it makes. Pure: it imports no Kafka client (a password file is read here,
when a client is made, so that a rotated secret reaches the next client).
"""

from __future__ import annotations

from pathlib import Path

from .config import Config


class KafkaSettingsError(ValueError):
    """A Kafka security setting cannot be used as given; the message names the setting, never a secret."""


class Secret(str):
    """A password as kafka-python takes it (a ``str``: it joins and encodes the characters themselves),
    but shown as ``***``: kafka-python logs each client's whole config at DEBUG level (``KafkaAdminClient``'s
    ``configs``, by ``repr`` of each value), and nothing should print it by ``str`` either."""

    def __repr__(self) -> str:
        return "'***'"

    def __str__(self) -> str:
        return "***"


def password(config: Config) -> str:
    """The SASL password (a ``Secret``): ``kafka_sasl_password``, or the contents of ``kafka_sasl_password_file``."""
    if not config.kafka_sasl_password_file:
        return Secret(config.kafka_sasl_password)
    try:
        text = Path(config.kafka_sasl_password_file).read_text()
    except OSError as exc:
        raise KafkaSettingsError(f"cannot read kafka_sasl_password_file {config.kafka_sasl_password_file}: "
                                 f"{exc.strerror}") from None
    # A secret written with ``echo`` ends in a newline that is no part of the password.
    return Secret(text.rstrip("\r\n"))


def connection(config: Config) -> dict:
    """kafka-python's ``bootstrap_servers`` and security keyword arguments for ``config``.

    Only what the protocol uses is given: SSL files with SSL and SASL_SSL, SASL
    credentials with SASL_PLAINTEXT and SASL_SSL (kafka-python's keyword for the SASL
    user and password is ``sasl_plain_*`` for the SCRAM mechanisms too).
    """
    protocol = config.kafka_security_protocol
    found = {"bootstrap_servers": config.bootstrap, "security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        found.update({name: value for name, value in (
            ("ssl_cafile", config.kafka_ssl_cafile), ("ssl_certfile", config.kafka_ssl_certfile),
            ("ssl_keyfile", config.kafka_ssl_keyfile)) if value})
    if protocol.startswith("SASL_"):
        found.update(sasl_mechanism=config.kafka_sasl_mechanism, sasl_plain_username=config.kafka_sasl_username,
                     sasl_plain_password=password(config))
    return found
