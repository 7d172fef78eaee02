"""The Helm chart, the compose file and the image, checked by the tools a platform team runs.

``helm lint --strict`` and ``helm template`` with the default and the production-like
values; ``kubernetes-validate --strict`` on every rendered object of a core kind, for the
oldest and the newest Kubernetes the chart is checked against; prometheus-operator's CRD
schemas on the ServiceMonitors and the PrometheusRule (which allow unknown fields, so
their fields are checked here too); the Compose Specification's schema on
deploy/compose.yaml; and that chart and compose run one image with the same settings,
ports and scrape jobs, and carry the same alert rules and dashboards as deploy/. helm and
the schemas come from npm through ``headwater.deploy.tools`` (cached). No cluster, no
Docker daemon.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import fields
from pathlib import Path

import jsonschema
import pytest
import yaml

from headwater.core import config as configuration
from headwater.core.config import Config
from headwater.deploy import tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "headwater"
PRODUCTION = CHART / "ci" / "production-values.yaml"
COMPOSE = ROOT / "deploy" / "compose.yaml"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
KUBERNETES = ("1.31.0", "1.37.0")  # the oldest and the newest checked
VALUES = {"default": [], "production": ["-f", str(PRODUCTION)]}
# The store in S3: every replica writes the bucket, the query service reads it.
S3_SETS = {"store.s3.uri": "s3://lineage/headwater", "store.s3.endpoint": "http://seaweedfs-s3.storage:8333",
           "store.s3.region": "eu-central-1", "store.s3.accessKeyId": "key-id-1234",
           "store.s3.secretAccessKey": "s3-secret-5678", "indexer.replicas": "3", "query.backend": "csprov",
           "query.narrowing.key": "narrowing-key-2468"}
RENDERED = {**VALUES, "s3": [arg for key, value in S3_SETS.items() for arg in ("--set", f"{key}={value}")]}
WORKLOADS = ("Deployment", "StatefulSet")
CUSTOM_KINDS = ("ServiceMonitor", "PrometheusRule")  # not Kubernetes' own: kubernetes-validate has no schema
SECRET_SETS = {"query.auth.token": "tok-0123456789abcdef", "graph.password": "graph-pw-4711",
               "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.username": "lineage",
               "kafka.sasl.password": "sasl-pw-0815"}


# Reads the objects as JSON on stdin, prints each one's schema violations; run in the models' folder.
CRD_CHECK = """
import { readFileSync } from "node:fs";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";
const models = { ServiceMonitor, PrometheusRule };
const errors = [];
for (const object of JSON.parse(readFileSync(0, "utf8"))) {
  try { new models[object.kind](object).validate(); }
  catch (e) { errors.push(`${object.kind}/${object.metadata.name}: ${e.message}`); }
}
process.stdout.write(JSON.stringify(errors));
"""


@pytest.fixture(scope="module")
def helm() -> Path:
    return tools.path("helm")


def crd_errors(objects: list[dict]) -> list[str]:
    """Violations of prometheus-operator's CRD schemas: types, required fields, enums, patterns (durations).

    Like the CRDs, the validators let unknown fields through (the API server prunes them).
    """
    done = subprocess.run(["node", "--input-type=module", "-e", CRD_CHECK], input=json.dumps(objects),
                          capture_output=True, text=True, cwd=tools.path("prometheus-operator-models"), timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        pytest.fail(f"helm {shlex.join(args)} failed: {done.stderr}")
    return done


def render(helm: Path, *options: str, kube: str = KUBERNETES[-1]) -> list[dict]:
    done = run_helm(helm, "template", "hw", str(CHART), "--namespace", "lineage", "--kube-version", kube, *options)
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def sets(values: dict) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def one(docs: list[dict], kind: str, suffix: str = "") -> dict:
    [found] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found


def pods(docs: list[dict]) -> dict[str, dict]:
    """Each workload's pod spec by its component: indexer, query, narrow."""
    return {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"]
            for d in docs if d["kind"] in WORKLOADS}


def environment(docs: list[dict]) -> set[str]:
    """The names the services' environment gets: the ConfigMap's and the containers' own."""
    names = set(one(docs, "ConfigMap", "hw-headwater")["data"])
    for pod in pods(docs).values():
        for container in pod["containers"]:
            names |= {e["name"] for e in container.get("env", [])}
    return names


@pytest.mark.parametrize("values", RENDERED)
def test_lint_is_clean(helm, values):
    done = run_helm(helm, "lint", "--strict", str(CHART), *RENDERED[values], check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    notes = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert notes == ["[INFO] Chart.yaml: icon is recommended"], done.stdout


@pytest.mark.parametrize("kube", KUBERNETES)
@pytest.mark.parametrize("values", RENDERED)
def test_rendered_objects_validate(helm, tmp_path, values, kube):
    docs = render(helm, *RENDERED[values], kube=kube)
    core = [d for d in docs if d["kind"] not in CUSTOM_KINDS]
    manifest = tmp_path / "core.yaml"
    manifest.write_text(yaml.safe_dump_all(core))
    done = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version", kube,
                           str(manifest)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    passed = re.findall(r"^INFO .* passed for resource (\S+) ", done.stdout, re.M)
    assert sorted(passed) == sorted(f"{d['kind'].lower()}/{d['metadata']['name']}" for d in core), done.stdout

    custom = [d for d in docs if d["kind"] in CUSTOM_KINDS]
    assert crd_errors(custom) == []
    kinds = sorted(d["kind"] for d in custom)
    assert kinds == ([] if values != "production" else ["PrometheusRule", "ServiceMonitor", "ServiceMonitor"])


def test_validators_refuse_what_a_cluster_would(helm, tmp_path):
    """Neither check passes everything: an unknown container field and a malformed duration are caught."""
    docs = render(helm, *VALUES["production"])
    indexer = one(docs, "StatefulSet")
    indexer["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    manifest = tmp_path / "indexer.yaml"
    manifest.write_text(yaml.safe_dump(indexer))
    done = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version",
                           KUBERNETES[-1], str(manifest)], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "readinessProbes" in done.stdout + done.stderr
    monitor = one(docs, "ServiceMonitor", "-indexer")
    monitor["spec"]["endpoints"][0]["interval"] = "30 seconds"
    [error] = crd_errors([monitor])
    assert "endpoints/0/interval must match pattern" in error


def test_custom_objects_have_only_known_fields(helm):
    """The CRD schemas let unknown fields through (the API server prunes them): a typo would vanish."""
    docs = render(helm, *VALUES["production"])
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        assert set(monitor["spec"]) == {"jobLabel", "selector", "endpoints"}
        for endpoint in monitor["spec"]["endpoints"]:
            assert set(endpoint) == {"port", "path", "interval"}
    rule = one(docs, "PrometheusRule")
    assert set(rule["spec"]) == {"groups"}
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "limit", "query_offset", "labels", "rules"}
        for each in group["rules"]:
            assert set(each) <= {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
            assert ("alert" in each) != ("record" in each)


def assert_locked_down(component: str, pod: dict) -> None:
    """Non-root, a read-only root filesystem (its writable paths volumes), no privilege, probes, resources."""
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True, component
        assert context["readOnlyRootFilesystem"] is True, component
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", component
        if component != "narrow":  # the narrower serves nothing but its metrics: alive is ready
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", component
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert container["livenessProbe"]["httpGet"]["port"] in ports
        assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert volumes[mounts["/tmp"]] == {"name": "tmp", "emptyDir": {}}
        assert mounts["/var/lib/headwater"] == "data"


@pytest.mark.parametrize("values", VALUES)
def test_workloads_run_locked_down_with_probes(helm, values):
    docs = render(helm, *VALUES[values])
    specs = pods(docs)
    assert set(specs) == {"indexer", "query"}  # no shared store: no narrower
    for component, pod in specs.items():
        assert_locked_down(component, pod)
    indexer = one(docs, "StatefulSet")
    claim = indexer["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "data" not in {v["name"] for v in specs["indexer"]["volumes"]}  # one claim per replica
    assert indexer["spec"]["replicas"] == (1 if values == "default" else 3)
    assert one(docs, "Deployment", "-query")["spec"]["replicas"] == (1 if values == "default" else 2)
    args = specs["indexer"]["containers"][0]["args"]
    assert args == ["index", "--metrics-port", "9101"]
    serve = specs["query"]["containers"][0]["args"]
    assert serve[:7] == ["serve", "--host", "0.0.0.0", "--port", "8080", "--token-file", "/etc/headwater/http/token"]
    assert serve[serve.index("--backend") + 1] == "cypher"  # no shared store: the graph answers


def test_secrets_stay_in_secrets(helm):
    docs = render(helm, *sets(SECRET_SETS))
    secret = one(docs, "Secret")
    held = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert held == {"http-token": SECRET_SETS["query.auth.token"], "graph-password": SECRET_SETS["graph.password"],
                    "kafka-sasl-password": SECRET_SETS["kafka.sasl.password"]}
    elsewhere = yaml.safe_dump_all([d for d in docs if d["kind"] != "Secret"])
    for value in held.values():
        assert value not in elsewhere
    config = one(docs, "ConfigMap", "hw-headwater")["data"]
    assert not [k for k in config if re.search("PASSWORD|TOKEN", k) and not k.endswith("_FILE")]
    assert config["HEADWATER_KAFKA_SASL_PASSWORD_FILE"] == "/etc/headwater/kafka-sasl/password"
    for pod in pods(docs).values():
        [password] = [e for e in pod["containers"][0]["env"] if e["name"] == "HEADWATER_GRAPH_PASSWORD"]
        assert password["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "graph-password"}
        mounted = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
        assert mounted["kafka-sasl"] == {"secretName": secret["metadata"]["name"],
                                         "items": [{"key": "kafka-sasl-password", "path": "password"}]}


def test_existing_secrets_are_referenced_not_made(helm):
    docs = render(helm, *VALUES["production"])
    assert not [d for d in docs if d["kind"] == "Secret"]
    specs = pods(docs)
    for pod in specs.values():
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert secrets["kafka-sasl"] == "headwater-kafka" and secrets["kafka-tls"] == "headwater-kafka-tls"
        [password] = [e for e in pod["containers"][0]["env"] if e["name"] == "HEADWATER_GRAPH_PASSWORD"]
        assert password["valueFrom"]["secretKeyRef"] == {"name": "headwater-neo4j", "key": "password"}
    token = {v["name"]: v for v in specs["query"]["volumes"]}["token"]["secret"]
    assert token == {"secretName": "headwater-http", "items": [{"key": "token", "path": "token"}]}
    config = one(docs, "ConfigMap", "hw-headwater")["data"]
    assert config["HEADWATER_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert config["HEADWATER_KAFKA_SSL_CAFILE"] == "/etc/headwater/kafka-tls/ca.crt"
    assert (config["HEADWATER_TOPIC_PARTITIONS"], config["HEADWATER_TOPIC_REPLICATION"]) == ("12", "3")


def test_shared_store(helm):
    """With a ReadWriteMany claim, every indexer and the query service (read-only) see one store."""
    docs = render(helm, *sets({"store.sharedClaim": "lineage-store", "query.backend": "auto"}))
    assert "volumeClaimTemplates" not in one(docs, "StatefulSet")["spec"]
    for kind, pod in pods(docs).items():
        [data] = [v for v in pod["volumes"] if v["name"] == "data"]
        assert data["persistentVolumeClaim"]["claimName"] == "lineage-store"
        [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "data"]
        assert mount.get("readOnly", False) == (kind == "query")


def test_store_in_s3(helm):
    """Replicas write the bucket with no volume of their own; the query service reads it; credentials from the
    chart's Secret, or one of the user's, never in the ConfigMap."""
    docs = render(helm, *RENDERED["s3"])
    indexer = one(docs, "StatefulSet")
    assert "volumeClaimTemplates" not in indexer["spec"] and indexer["spec"]["replicas"] == 3
    config = one(docs, "ConfigMap", "hw-headwater")["data"]
    assert (config["HEADWATER_STORE_DIR"], config["AWS_ENDPOINT_URL"], config["AWS_REGION"]) == \
        ("s3://lineage/headwater", "http://seaweedfs-s3.storage:8333", "eu-central-1")
    secret = one(docs, "Secret")
    held = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert (held["access-key-id"], held["secret-access-key"]) == ("key-id-1234", "s3-secret-5678")
    assert "s3-secret-5678" not in yaml.safe_dump_all([d for d in docs if d["kind"] != "Secret"])
    for kind, pod in pods(docs).items():
        assert {v["name"]: v for v in pod["volumes"]}["data"] == {"name": "data", "emptyDir": {}}, kind
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in pod["containers"][0]["env"]}
        assert env["AWS_ACCESS_KEY_ID"] == {"name": secret["metadata"]["name"], "key": "access-key-id"}
        assert env["AWS_SECRET_ACCESS_KEY"] == {"name": secret["metadata"]["name"], "key": "secret-access-key"}
    serve = pods(docs)["query"]["containers"][0]["args"]
    assert serve[serve.index("--backend") + 1] == "csprov"
    # A Secret of the user's is referenced, not made; with no keys at all the pods' own identity is used.
    theirs = render(helm, *RENDERED["s3"], *sets({"store.s3.accessKeyId": "", "store.s3.secretAccessKey": "",
                                                  "store.s3.existingSecret": "lineage-s3"}))
    assert "access-key-id" not in one(theirs, "Secret")["data"]
    for pod in pods(theirs).values():
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in pod["containers"][0]["env"]}
        assert env["AWS_ACCESS_KEY_ID"] == {"name": "lineage-s3", "key": "access-key-id"}
    identity = render(helm, *RENDERED["s3"], *sets({"store.s3.accessKeyId": "", "store.s3.secretAccessKey": ""}))
    for pod in pods(identity).values():
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & {e["name"] for e in pod["containers"][0]["env"]}


@pytest.mark.parametrize("options, error", [
    ({"query.backend": "csprov"}, "query.backend csprov reads the store: set store.s3.uri or store.sharedClaim"),
    ({"store.s3.uri": "lineage/headwater"}, "store.s3.uri: s3://bucket/prefix, not lineage/headwater"),
    ({"store.s3.uri": "s3://lineage", "store.s3.accessKeyId": "k"}, "store.s3.secretAccessKey goes with"),
    ({"query.auth.token": "short"}, "query.auth.token: at least 16 characters"),
    ({"kafka.sasl.mechanism": "PLAIN", "kafka.sasl.username": "lineage"},
     "kafka.sasl.password or kafka.sasl.existingSecret goes with"),
    ({"kafka.securityProtocol": "SASL_SSL"}, "kafka.securityProtocol SASL_SSL needs kafka.sasl.mechanism"),
    ({"kafka.sasl.mechanism": "PLAIN", "kafka.sasl.password": "pw"}, "kafka.sasl.mechanism needs kafka.sasl.username"),
    ({"extraEnv.HEADWATER_TOPIC_PARTITIONS": "12"}, "extraEnv.HEADWATER_TOPIC_PARTITIONS: the chart sets it"),
    ({"extraEnv.HEADWATER_GRAPH_PASSWORD": "pw"}, "extraEnv.HEADWATER_GRAPH_PASSWORD: a secret does not belong"),
])
def test_values_that_cannot_work_are_refused(helm, options, error):
    done = run_helm(helm, "template", "hw", str(CHART), *sets(options), check=False)
    assert done.returncode != 0 and error in done.stderr


def test_monitoring_carries_deploys_rules_and_dashboards(helm):
    assert RULES.exists(), f"{RULES.relative_to(ROOT)} is not written yet"
    assert (CHART / "files" / "rules.yaml").read_bytes() == RULES.read_bytes(), \
        "helm/headwater/files/rules.yaml must be a copy of deploy/prometheus/rules.yaml"
    ours = {p.name: p.read_bytes() for p in (CHART / "files" / "dashboards").glob("*.json")}
    theirs = {p.name: p.read_bytes() for p in DASHBOARDS.glob("*.json")}
    assert theirs and ours == theirs, "helm/headwater/files/dashboards/ must be a copy of deploy/grafana/dashboards/"

    docs = render(helm, *VALUES["production"])
    assert one(docs, "PrometheusRule")["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    dashboards = one(docs, "ConfigMap", "-dashboards")
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert {name: json.loads(text) for name, text in dashboards["data"].items()} == \
        {name: json.loads(text) for name, text in theirs.items()}
    services = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in docs if d["kind"] == "Service"}
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        selected = [s for s in services.values()
                    if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        [service] = selected
        assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert monitor["spec"]["jobLabel"] in service["metadata"]["labels"]


@pytest.mark.parametrize("values", VALUES)
def test_settings_load_as_a_config(helm, tmp_path, monkeypatch, values):
    """The services' environment is headwater's own settings (load() would ignore a misspelt one), and valid."""
    docs = render(helm, *VALUES[values])
    names = environment(docs)
    known = {f"HEADWATER_{f.name.upper()}" for f in fields(Config)} | {"HEADWATER_HOME"}
    assert names - known == set()
    for name in names:
        monkeypatch.setenv(name, one(docs, "ConfigMap", "hw-headwater")["data"].get(name, "from-a-secret"))
    config = configuration.load(tmp_path)
    assert (config.metrics_host, config.store_dir, config.graph_password) == \
        ("0.0.0.0", "/var/lib/headwater/store", "from-a-secret")
    if values == "production":
        assert (config.kafka_security_protocol, config.kafka_sasl_mechanism, config.kafka_sasl_password_file,
                config.kafka_ssl_cafile, config.topic_replication) == \
            ("SASL_SSL", "SCRAM-SHA-512", "/etc/headwater/kafka-sasl/password", "/etc/headwater/kafka-tls/ca.crt", 3)


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_file_follows_the_compose_specification():
    schema = json.loads(tools.path("compose-schema").read_text())
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []


def test_compose_mounts_deploys_files():
    for service in compose()["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"compose mounts {source}, which is not there"
    # Grafana's provisioned data source is compose's Prometheus.
    datasources = yaml.safe_load((COMPOSE.parent / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
                                 .read_text())["datasources"]
    assert [d["url"] for d in datasources] == ["http://prometheus:9090"]
    assert "127.0.0.1:9090:9090" in compose()["services"]["prometheus"]["ports"]


def test_compose_prometheus_config_loads_the_rules(tmp_path):
    scrape = yaml.safe_load(compose()["configs"]["prometheus"]["content"])
    [mounted] = [v.split(":")[0] for v in compose()["services"]["prometheus"]["volumes"]
                 if v.split(":")[1] in scrape["rule_files"]]
    scrape["rule_files"] = [str((COMPOSE.parent / mounted).resolve())]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape))
    done = subprocess.run([str(tools.path("promtool")), "check", "config", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"SUCCESS: \d+ rules found", done.stdout + done.stderr)


def test_compose_and_chart_agree(helm):
    """Compose keeps its store in its own S3 server: the chart with the store in S3 (and a narrowing key: the
    narrower runs, as compose's narrowing profile does)."""
    docs = render(helm, *RENDERED["s3"], *sets({"store.s3.endpoint": "http://s3:8333", "store.s3.region": "us-east-1"}))
    services = compose()["services"]
    specs = pods(docs)
    image = "headwater:" + yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert set(specs) == {"indexer", "query", "narrow"}
    for name, pod in specs.items():
        ours, container = services[name], pod["containers"][0]
        assert ours["image"] == container["image"] == image
        assert set(ours["environment"]) == environment(docs), name
        assert ours["user"] == "{runAsUser}:{runAsGroup}".format(**pod["securityContext"])
        assert ours["read_only"] is True
        # Same command; only where the token file lies and which backend answers differ.
        differ = {"/run/secrets/http-token": "/etc/headwater/http/token", "auto": "csprov"}
        assert [differ.get(arg, arg) for arg in ours["command"]] == container["args"], name
        published = {int(p.rsplit(":", 1)[1]) for p in ours["ports"]}
        assert published == {p["containerPort"] for p in container["ports"]}, name
    config = one(docs, "ConfigMap", "hw-headwater")["data"]
    shared = services["indexer"]["environment"]
    for key in ("HEADWATER_HOME", "HEADWATER_STORE_DIR", "HEADWATER_METRICS_HOST", "HEADWATER_EDGES_TOPIC",
                "HEADWATER_LOG_TOPIC", "HEADWATER_DLQ_TOPIC", "HEADWATER_GRAPH_DATABASE", "AWS_ENDPOINT_URL",
                "AWS_REGION"):
        assert shared[key] == config[key], key
    # Prometheus scrapes the same jobs on the same ports as the ServiceMonitors.
    scrape = yaml.safe_load(compose()["configs"]["prometheus"]["content"])
    jobs = {job["job_name"]: job["static_configs"][0]["targets"][0] for job in scrape["scrape_configs"]}
    assert set(jobs) == {"headwater-indexer", "headwater-query", "headwater-narrow", "headwater-capture"}
    for service in (d for d in docs if d["kind"] == "Service"):
        component = service["metadata"]["labels"]["app.kubernetes.io/component"]
        job = service["metadata"]["labels"]["headwater.io/job"]
        assert jobs[job] == f"{component}:{service['spec']['ports'][0]['port']}"


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_image_is_lean_and_runs_as_the_charts_user(helm):
    steps = dockerfile()
    assert [args for op, args in steps if op == "FROM"] == ["python:3.11-slim AS build", "python:3.11-slim"]
    text = " ".join(args for _, args in steps)
    assert not re.search(r"\b(openjdk|jdk|jre|default-jre)\b", text)
    [user] = [args for op, args in steps if op == "USER"]
    pod = pods(render(helm))["query"]["securityContext"]
    assert user == f"{pod['runAsUser']}:{pod['runAsGroup']}"
    [entrypoint] = [json.loads(args) for op, args in steps if op == "ENTRYPOINT"]
    assert entrypoint == ["headwater"]
    exposed = {int(p) for op, args in steps if op == "EXPOSE" for p in args.split()}
    assert exposed == {8080, 9101, 9102}


def test_image_sources_build_the_package(tmp_path):
    """What the Dockerfile copies (and .dockerignore lets through) is enough to build headwater's wheel."""
    copied = [args.split() for op, args in dockerfile() if op == "COPY" and "--from" not in args]
    sources = [source for *names, _ in copied for source in names]
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    assert set(sources) <= allowed
    context = tmp_path / "context"
    context.mkdir()
    for source in sources:
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / source, context / source)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
                           str(tmp_path / "wheel"), str(context)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [wheel] = (tmp_path / "wheel").glob("headwater-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"headwater/indexer/service.py", "headwater/query/http/server.py", "headwater/cli.py"} <= names
    [entry_points] = [n for n in names if n.endswith("entry_points.txt")]
    assert "headwater = headwater.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_extra_settings_reach_the_configmap(helm):
    docs = render(helm, *sets({"extraEnv.HEADWATER_SPILL_MAX_BYTES": "2147483648"}))
    config = one(docs, "ConfigMap", "hw-headwater")["data"]
    assert config["HEADWATER_SPILL_MAX_BYTES"] == "2147483648" and config["HEADWATER_TOPIC_PARTITIONS"] == "2"


@pytest.mark.parametrize("values, secret, key", [
    (["-f", str(PRODUCTION)], "headwater-narrowing", "key"),
    (["--set", "query.narrowing.key=shared-with-the-spark-jobs"], "hw-headwater", "narrowing-key"),
    ([], None, None),
])
def test_the_narrowing_key_reaches_the_query_service_from_a_secret(helm, values, secret, key):
    """The key black boxes' functions are signed with: from the platform's Secret, the chart's, or none."""
    docs = render(helm, *values)
    query = one(docs, "Deployment", "-query")
    env = {e["name"]: e for e in query["spec"]["template"]["spec"]["containers"][0]["env"]}
    if secret is None:
        assert "HEADWATER_NARROWING_KEY" not in env
        return
    assert env["HEADWATER_NARROWING_KEY"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}
    if secret == "hw-headwater":
        data = one(docs, "Secret")["data"]
        assert base64.b64decode(data["narrowing-key"]).decode() == "shared-with-the-spark-jobs"


@pytest.mark.parametrize("key", ["query.auth.token", "graph.password", "kafka.sasl.password", "query.narrowing.key",
                                 "store.s3.secretAccessKey"])
def test_a_secret_value_the_chart_holds_rolls_every_workload(helm, key):
    """Each workload's checksum/secret changes with any secret value the chart's Secret holds, so its pods restart
    with the new value; the same values render the same checksums."""
    base = {**S3_SETS, **SECRET_SETS}

    def checksums(values: dict) -> dict[str, str]:
        return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/secret"]
                for d in render(helm, *sets(values)) if d["kind"] in WORKLOADS}

    before = checksums(base)
    assert set(before) == {"hw-headwater-indexer", "hw-headwater-query", "hw-headwater-narrow"}
    assert checksums(base) == before
    after = checksums({**base, key: base[key] + "-rotated"})
    assert [name for name in before if after[name] == before[name]] == []


def test_the_narrower_runs_with_a_key_and_a_shared_store(helm):
    """headwater narrow --follow runs beside the indexer where black boxes can be narrowed: a narrowing key and a
    store the narrower reads the batch log from and keeps its narrowings in (S3, or a shared claim it writes)."""
    docs = render(helm, *RENDERED["s3"], *sets({"monitoring.serviceMonitor.enabled": "true"}))
    narrow = one(docs, "Deployment", "-narrow")
    pod = pods(docs)["narrow"]
    assert_locked_down("narrow", pod)
    [container] = pod["containers"]
    assert container["args"] == ["narrow", "--follow", "--metrics-port", "9102"]
    assert narrow["spec"]["replicas"] == 1
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    secret = one(docs, "Secret")["metadata"]["name"]
    assert env["HEADWATER_NARROWING_KEY"] == {"name": secret, "key": "narrowing-key"}
    assert env["AWS_ACCESS_KEY_ID"] == {"name": secret, "key": "access-key-id"}
    assert {v["name"]: v for v in pod["volumes"]}["data"] == {"name": "data", "emptyDir": {}}
    # Its lag is scraped as job headwater-narrow, the job HeadwaterNarrowingBehind names by.
    service = one(docs, "Service", "-narrow")
    assert service["metadata"]["labels"]["headwater.io/job"] == "headwater-narrow"
    assert service["spec"]["ports"][0]["port"] == 9102
    monitor = one(docs, "ServiceMonitor", "-narrow")
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "narrow"
    # On a shared claim it writes the store (the query service reads it).
    shared = render(helm, *sets({"store.sharedClaim": "lineage-store", "query.narrowing.key": "k" * 16}))
    [mount] = [m for m in pods(shared)["narrow"]["containers"][0]["volumeMounts"] if m["name"] == "data"]
    assert "readOnly" not in mount
    assert {v["name"]: v for v in pods(shared)["narrow"]["volumes"]}["data"]["persistentVolumeClaim"] == \
        {"claimName": "lineage-store"}
    # No key, no shared store (production: each indexer's store its own), or turned off: no narrower.
    for options in ({**S3_SETS, "query.narrowing.key": ""}, {"query.narrowing.key": "k" * 16},
                    {**S3_SETS, "narrow.enabled": "false"}):
        rendered = render(helm, *sets(options), *sets({"monitoring.serviceMonitor.enabled": "true"}))
        assert "narrow" not in pods(rendered), options
        assert not [d for d in rendered if d["metadata"]["name"].endswith("-narrow")], options
    assert "narrow" not in pods(render(helm, *VALUES["production"]))
