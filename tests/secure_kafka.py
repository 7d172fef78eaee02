"""A SASL_SSL Apache Kafka broker of a test's own: SCRAM-SHA-512 users made by KRaft's bootstrap, TLS
certificates made here with openssl, and ACLs (Kafka's ``StandardAuthorizer``) set with Kafka's own
``kafka-acls`` (``org.apache.kafka.tools.AclCommand``).

``SecureKafka(folder)`` makes a CA, the broker's certificate for 127.0.0.1 and two users: ``admin``
(a super user: the broker's own connections and the ACLs) and ``headwater``, the principal capture, the
drain, the indexer and the query tier run as, which gets nothing until ``allow`` grants it.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

from headwater.core.config import Config
from headwater.deploy.kafka_server import KafkaServer, java
from headwater.deploy.stack import free_port
from headwater.deploy.tools import kafka
from tests.conftest import stop_process

MECHANISM = "SCRAM-SHA-512"
ADMIN, USER = "admin", "headwater"
ACL_COMMAND = "org.apache.kafka.tools.AclCommand"


def openssl(*arguments: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *arguments], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"openssl {' '.join(arguments)}: {done.stderr}"


def certificate_authority(folder: Path, name: str) -> Path:
    """A CA's certificate and key (``name.pem``, ``name.key``); the certificate's path."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=folder)
    return folder / f"{name}.pem"


def signed_certificate(folder: Path, ca: str, name: str, address: str) -> Path:
    """A key and a certificate for ``address`` signed by the CA ``ca``, both in one PEM file (key in PKCS#8,
    as Kafka's PEM keystore takes it); the file's path."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.rsa",
            "-out", f"{name}.csr", cwd=folder)
    (folder / f"{name}.ext").write_text(f"subjectAltName=IP:{address},DNS:localhost\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=folder)
    openssl("pkcs8", "-topk8", "-nocrypt", "-in", f"{name}.rsa", "-out", f"{name}.key", cwd=folder)
    keystore = folder / f"{name}-keystore.pem"
    keystore.write_text((folder / f"{name}.key").read_text() + (folder / f"{name}.crt").read_text())
    return keystore


def jaas(user: str, password: str) -> str:
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'


class SecureKafka:
    def __init__(self, folder: Path, host: str = "127.0.0.1"):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.passwords = {ADMIN: secrets.token_urlsafe(16), USER: secrets.token_urlsafe(16)}
        self.ca = certificate_authority(self.folder, "ca")
        self.other_ca = certificate_authority(self.folder, "other-ca")  # a CA the broker's certificate is not of
        keystore = signed_certificate(self.folder, "ca", "broker", host)
        self.jars = kafka()
        self.server = KafkaServer(
            self.folder / "broker", free_port(), free_port(), host=host, listeners={"SASL_SSL": "SASL_SSL"},
            scram_users={MECHANISM: {ADMIN: self.passwords[ADMIN], USER: self.passwords[USER]}},
            properties={
                "sasl.enabled.mechanisms": MECHANISM,
                "sasl.mechanism.inter.broker.protocol": MECHANISM,
                f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas(ADMIN, self.passwords[ADMIN]),
                "ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore),
                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca),
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                # The node's own KRaft controller listener is plaintext on its address (no client is told of it),
                # where it is ANONYMOUS: a super user too, or the node cannot register with its own controller.
                "super.users": f"User:{ADMIN};User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "false",
            })
        self.proc: subprocess.Popen | None = None
        self.password_file = self.folder / "headwater-password"
        self.password_file.write_text(self.passwords[USER] + "\n")
        self.password_file.chmod(0o600)

    @property
    def bootstrap(self) -> str:
        return self.server.bootstrap

    def start(self) -> None:
        self.proc = self.server.start(self.jars, self.folder / "broker.log")

    def stop(self) -> None:
        stop_process(self.proc)

    # clients ------------------------------------------------------------------------------------

    def config(self, base: Config, password_file: Path | None = None, cafile: Path | None = None) -> Config:
        """``base`` as the ``headwater`` principal of this broker: its password from a file."""
        return base.with_overrides(bootstrap=self.bootstrap, kafka_security_protocol="SASL_SSL",
                                   kafka_sasl_mechanism=MECHANISM, kafka_sasl_username=USER,
                                   kafka_sasl_password="",
                                   kafka_sasl_password_file=str(password_file or self.password_file),
                                   kafka_ssl_cafile=str(cafile or self.ca))

    def spark_options(self) -> dict[str, str]:
        """Spark's Kafka connector options of the ``headwater`` principal (what a user's job sets)."""
        return {"kafka.bootstrap.servers": self.bootstrap, "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.mechanism": MECHANISM, "kafka.sasl.jaas.config": jaas(USER, self.passwords[USER]),
                "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": str(self.ca)}

    def admin_properties(self) -> Path:
        """The admin's client config, as Kafka's own tools take it (``--command-config``)."""
        path = self.folder / "admin.properties"
        path.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism={MECHANISM}\n"
                        f"sasl.jaas.config={jaas(ADMIN, self.passwords[ADMIN])}\n"
                        f"ssl.truststore.type=PEM\nssl.truststore.location={self.ca}\n")
        path.chmod(0o600)
        return path

    def acls(self, *arguments: str) -> str:
        """Run Kafka's ``kafka-acls`` as the admin; its output."""
        done = subprocess.run([java(), "-Xmx256m", "-cp", f"{self.jars}/*", ACL_COMMAND, "--bootstrap-server",
                               self.bootstrap, "--command-config", str(self.admin_properties()), *arguments],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"kafka-acls {' '.join(arguments)}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
        return done.stdout

    def allow(self, topic_prefix: str, group_prefix: str, operations=("All",)) -> None:
        """Let the ``headwater`` principal use the topics and consumer groups of these prefixes, nothing else."""
        for resource in (("--topic", topic_prefix), ("--group", group_prefix)):
            allowed = [argument for o in operations for argument in ("--operation", o)]
            self.acls("--add", "--allow-principal", f"User:{USER}", *allowed, *resource,
                      "--resource-pattern-type", "prefixed")
