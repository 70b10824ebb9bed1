"""deploy/ checked against the code: the container image, compose, the Helm chart (rendered here:
tests/support/helm.py) and its checked-in manifests, the systemd unit, the example config and the
Grafana dashboard. Docker, helm and systemd cannot run here, so every port, path, setting, route,
command and metric these files name is checked to exist."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import helm
from tests.support.paho import V5, Endpoints, connect
from tests.support.server import RunningServer
from trimaran.app import App
from trimaran.cli import build_parser
from trimaran.config import Settings, load_settings
from trimaran.config_example import example_toml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "container" / "Dockerfile"


@pytest.fixture(autouse=True)
def _no_trimaran_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("TRIMARAN_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def settings_with_env(env: dict[str, str], config: Path | None = None) -> Settings:
    """Load settings the way the server would with these variables (each must be a known key)."""
    for key in env:
        assert key.startswith("TRIMARAN_"), key
        path = key.removeprefix("TRIMARAN_").lower().split("__")
        model: Any = Settings
        for part in path:
            assert part in model.model_fields, f"{key}: no setting {'.'.join(path)}"
            model = model.model_fields[part].annotation
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return load_settings(config)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def routes() -> set[tuple[str, str]]:
    app = App(Settings())
    return {(route.method, "/" + "/".join(route.segments)) for route in app.http.routes}


def cli_accepts(argv: list[str]) -> None:
    build_parser().parse_args(argv)  # raises SystemExit(2) on anything unknown


# -- the example configuration ----------------------------------------------------------------------


def test_example_config_is_generated_from_the_model() -> None:
    checked_in = (DEPLOY / "trimaran.toml").read_text()
    assert checked_in == example_toml(), "regenerate: trimaran config example > deploy/trimaran.toml"


def test_example_config_loads_to_the_defaults() -> None:
    loaded = load_settings(DEPLOY / "trimaran.toml")
    assert loaded.model_dump(mode="json") == Settings().model_dump(mode="json")


def test_every_setting_is_in_the_example() -> None:
    text = (DEPLOY / "trimaran.toml").read_text()

    def keys(model: Any, prefix: str) -> Iterator[str]:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else None
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                assert f"[{prefix}{name}]" in text
                yield from keys(annotation, f"{prefix}{name}.")
            elif isinstance(item, type) and hasattr(item, "model_fields"):
                assert f"# [[{prefix}{name}]]" in text  # repeated tables: an entry, commented out
                yield from item.model_fields
            else:
                yield name

    for key in keys(Settings, ""):
        assert re.search(rf"^(# )?{key} = ", text, re.M), f"{key} is missing from deploy/trimaran.toml"


# -- the container image ----------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str, str]]:
    """(stage, instruction, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out, stage = [], ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stage = args.split(" AS ")[-1].strip() if " AS " in args else ""
        out.append((stage, instruction.upper(), args.strip()))
    return out


def stage_args(stage: str, instruction: str) -> list[str]:
    return [args for s, i, args in dockerfile() if s == stage and i == instruction]


def test_image_stages_and_what_they_copy() -> None:
    stages = {s for s, i, _ in dockerfile() if i == "FROM"}
    assert {"build", "build-analytics", "runtime", "analytics"} <= stages
    for args in stage_args("build", "COPY"):
        *sources, _target = args.split()
        for source in sources:
            assert (ROOT / source).exists(), source
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
    for args in stage_args("build", "COPY"):
        for source in args.split()[:-1]:
            assert f"!{source.rstrip('/')}" in {line.rstrip("/") for line in ignore}, f"{source} is ignored"


def test_image_compiles_in_its_build_stage_and_ships_no_compiler() -> None:
    """The build stage has gcc, forces the compiled wheel and checks the installed build says so; the
    runtime stages take only the venv from it and install no compiler of their own."""
    env = " ".join(stage_args("build", "ENV"))
    assert "TRIMARAN_BUILD=compiled" in shlex.split(env)
    installs = " ".join(stage_args("build", "RUN"))
    assert re.search(r"apt-get install .*\bgcc\b", installs)
    assert re.search(r"trimaran version \| grep -q \"\^build: compiled,\"", installs)
    # What setup.py needs to compile (MANIFEST.in ships the same into the sdist).
    copied = {source for args in stage_args("build", "COPY") for source in args.split()[:-1]}
    assert {"setup.py", "scripts/mypyc_build.py"} <= copied
    for stage in ("runtime", "analytics"):
        assert not any(
            re.search(r"\b(gcc|cc|clang|build-essential|python3-dev)\b", a) for a in stage_args(stage, "RUN")
        )
        for args in stage_args(stage, "COPY"):
            assert args.startswith("--from=build") and args.endswith("/opt/trimaran /opt/trimaran"), args


def docker_engine() -> str | None:
    """Why no image can be built here, or None where a container engine answers."""
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"no docker ({error})"
    return None if done.returncode == 0 else f"no container engine: {done.stderr.strip()[-120:]}"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_image_builds_and_starts_compiled(tmp_path: Path) -> None:
    lacking = docker_engine()
    if lacking is not None:
        pytest.skip(lacking)
    tag = f"trimaran-test:{os.getpid()}"
    build = ["docker", "build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)]
    subprocess.run(build, check=True, timeout=3300)
    try:
        version = subprocess.run(
            ["docker", "run", "--rm", tag, "version"], capture_output=True, text=True, timeout=120
        )
        assert "build: compiled" in version.stdout, version
        name = f"trimaran-test-{os.getpid()}"
        subprocess.run(["docker", "run", "-d", "--name", name, tag], check=True, timeout=120)
        try:
            deadline = time.monotonic() + 60
            logs = ""
            while time.monotonic() < deadline and "compiled" not in logs:
                time.sleep(1)
                done = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=30)
                logs = done.stdout + done.stderr
            assert "compiled (mypyc)" in logs, logs
        finally:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


def test_image_runs_as_an_unprivileged_user_with_volumes_and_a_health_check() -> None:
    (user,) = stage_args("runtime", "USER")
    assert not user.startswith(("0", "root"))
    assert stage_args("analytics", "USER")[-1] == user
    env = dict(
        pair.split("=", 1)
        for args in stage_args("runtime", "ENV")
        for pair in shlex.split(args)
        if "=" in pair
    )
    trimaran_env = {k: v for k, v in env.items() if k.startswith("TRIMARAN_")}
    settings = settings_with_env(trimaran_env)
    assert json.loads(stage_args("runtime", "VOLUME")[0]) == [str(settings.storage.data_dir)]
    (health,) = stage_args("runtime", "HEALTHCHECK")
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", health)
    assert url is not None and settings.http.bind is not None
    assert int(url.group(1)) == settings.http.bind.port and settings.http.bind.host == "0.0.0.0"
    assert ("GET", url.group(2)) in routes()
    assert stage_args("analytics", "HEALTHCHECK") == ["NONE"]


def test_image_exposes_every_listener_port() -> None:
    exposed = {int(p) for args in stage_args("runtime", "EXPOSE") for p in args.split()}
    defaults = Settings()
    bound = [defaults.listeners.mqtt, defaults.listeners.mqtt_ws, defaults.listeners.amqp, defaults.http.bind]
    assert {e.port for e in bound if e is not None} <= exposed
    assert {8883, 8084, 5671} <= exposed  # TLS, secure WebSocket, AMQPS where the chart puts them


def test_image_commands_are_real_commands() -> None:
    (entrypoint,) = stage_args("runtime", "ENTRYPOINT")
    assert json.loads(entrypoint) == ["trimaran"]
    for stage in ("runtime", "analytics"):
        cli_accepts(json.loads(stage_args(stage, "CMD")[-1]))
    (workdir,) = stage_args("runtime", "WORKDIR")
    assert workdir == "/etc/trimaran"  # where ./trimaran.toml is read from


# -- compose ------------------------------------------------------------------------------------------


def test_compose_file() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "trimaran", "audit"}
    stages = {s for s, i, _ in dockerfile() if i == "FROM"}
    exposed = {int(p) for args in stage_args("runtime", "EXPOSE") for p in args.split()}
    for name in ("trimaran", "audit"):
        build = services[name]["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
        assert build["target"] in stages
        env = {k: re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", v) for k, v in services[name]["environment"].items()}
        settings = settings_with_env(env)
        assert settings.storage.effective_url().startswith("postgresql://trimaran:trimaran@postgres:5432/")
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    server = services["trimaran"]
    assert {int(p.split(":")[1]) for p in server["ports"]} <= exposed
    config_mount = next(v for v in server["volumes"] if v.endswith(":/etc/trimaran/trimaran.toml:ro"))
    assert (DEPLOY / config_mount.split(":")[0]).resolve() == DEPLOY / "trimaran.toml"
    audit = services["audit"]
    cli_accepts(audit["command"])
    assert audit["profiles"] == ["audit"] and audit["restart"] == "no"  # a one-shot job
    assert services["postgres"]["healthcheck"]["test"][1] == "pg_isready"


def haproxy_config() -> dict[str, list[list[str]]]:
    """deploy/cluster/haproxy.cfg as section -> its lines split into words."""
    sections: dict[str, list[list[str]]] = {}
    current: list[list[str]] = []
    for raw in (DEPLOY / "cluster" / "haproxy.cfg").read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not line[0].isspace():
            current = sections.setdefault(line.strip(), [])
        else:
            current.append(line.split())
    return sections


def test_cluster_compose_file_runs_two_nodes_on_one_postgresql_behind_haproxy() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.cluster.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "node-a", "node-b", "haproxy"}
    exposed = {int(p) for args in stage_args("runtime", "EXPOSE") for p in args.split()}
    nodes = {}
    for name in ("node-a", "node-b"):
        service = services[name]
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).resolve() == DOCKERFILE
        env = {k: re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", v) for k, v in service["environment"].items()}
        # the image sets the listeners' and the admin API's addresses (0.0.0.0:8080)
        settings = settings_with_env({**env, "TRIMARAN_HTTP__BIND": "0.0.0.0:8080"})
        assert settings.cluster.enabled and settings.storage.effective_url().startswith("postgresql://")
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        nodes[settings.node_name] = settings
    assert set(nodes) == {"node-a", "node-b"}  # node_name unique per node, and the service's name
    haproxy = services["haproxy"]
    assert (DEPLOY / haproxy["build"]["context"] / haproxy["build"]["dockerfile"]).is_file()
    mount = haproxy["volumes"][0].split(":")
    assert (DEPLOY / mount[0]).resolve() == DEPLOY / "cluster" / "haproxy.cfg"
    assert mount[1] == "/etc/haproxy/haproxy.cfg"
    config = haproxy_config()
    published = {int(p.split(":")[1]) for p in haproxy["ports"]}
    bound = set()
    for section, lines in config.items():
        if section.startswith("frontend"):
            bound |= {int(words[1].rpartition(":")[2]) for words in lines if words[0] == "bind"}
    assert published == bound and bound <= exposed
    known = routes()
    for section, lines in config.items():
        if not section.startswith("backend"):
            continue
        check = next(words for words in lines if words[:2] == ["option", "httpchk"])
        assert ("GET", check[3]) in known and check[3] == "/readyz"
        servers = [words for words in lines if words[0] == "server"]
        assert {words[1] for words in servers} == set(nodes)
        for words in servers:
            host, _, port = words[2].partition(":")
            settings = nodes[host]
            ports = {
                e.port
                for e in (settings.listeners.mqtt, settings.listeners.mqtt_ws, settings.listeners.amqp)
                if e
            }
            assert settings.http.bind is not None
            assert int(port) in ports | {settings.http.bind.port}
    defaults = config["defaults"]
    assert ["default-server", "check", "port", "8080", "inter", "2s", "fall", "2", "rise", "2"] in defaults
    assert (DEPLOY / "cluster" / "haproxy.Dockerfile").read_text().count("apt-get install") == 1


@pytest.mark.skipif(not __import__("shutil").which("haproxy"), reason="haproxy is not installed")
def test_haproxy_accepts_the_cluster_config() -> None:
    # the node names resolve only inside compose's network: check the syntax with them mapped away
    text = (DEPLOY / "cluster" / "haproxy.cfg").read_text().replace("node-a:", "127.0.0.1:")
    text = text.replace("node-b:", "127.0.0.2:")
    Path("haproxy.cfg").write_text(text)
    done = subprocess.run(["haproxy", "-c", "-f", "haproxy.cfg"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


# -- Helm ---------------------------------------------------------------------------------------------


def manifests(overrides: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(helm.render_chart(overrides)) if doc}


def check_workload(docs: dict[str, dict[str, Any]], kind: str) -> None:
    workload = docs[kind]
    pod = workload["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (
        workload["spec"]["selector"]["matchLabels"].items()
        <= workload["spec"]["template"]["metadata"]["labels"].items()
    )
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    cli_accepts(container["args"])
    known = routes()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        assert ("GET", get["path"]) in known and get["port"] in ports
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    secret = docs["Secret"]["stringData"]
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            assert ref["name"] == docs["Secret"]["metadata"]["name"] and ref["key"] in secret
            env[item["name"]] = secret[ref["key"]]
        else:
            env[item["name"]] = "trimaran-0"  # the pod's name
    config = Path("trimaran.toml")
    config.write_text(docs["ConfigMap"]["data"]["trimaran.toml"])
    settings = settings_with_env(
        {"TRIMARAN_STORAGE__DATA_DIR": "/var/lib/trimaran", "TRIMARAN_HTTP__BIND": "0.0.0.0:8080", **env},
        config,
    )
    assert settings.http.bind is not None and ports["http"] == settings.http.bind.port
    listeners = settings.listeners
    expected = {
        "mqtt": listeners.mqtt,
        "mqtt-ws": listeners.mqtt_ws,
        "amqp": listeners.amqp,
        "mqtt-tls": listeners.mqtt_tls,
        "amqps": listeners.amqps,
    }
    for name, endpoint in expected.items():
        assert (endpoint.port if endpoint else None) == ports.get(name), name
    service_ports = {p["name"]: p["targetPort"] for p in docs["Service"]["spec"]["ports"]}
    assert set(service_ports) == set(ports) and all(service_ports[n] == n for n in ports)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == "/var/lib/trimaran" and mounts["config"] == "/etc/trimaran/trimaran.toml"


def test_chart_on_sqlite_is_a_statefulset_with_a_volume() -> None:
    docs = manifests()
    assert set(docs) == {"ConfigMap", "Secret", "Service", "StatefulSet"}
    check_workload(docs, "StatefulSet")
    statefulset = docs["StatefulSet"]
    assert statefulset["spec"]["replicas"] == 1
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"


def test_chart_on_postgresql_is_a_deployment_sharing_queues_with_tls() -> None:
    docs = manifests(
        {
            "storage": {"mode": "postgresql", "postgresqlUrl": "postgresql://trimaran:pw@db:5432/trimaran"},
            "tls": {"enabled": True, "cert": "PEM", "key": "PEM"},
            "users": [{"name": "alice", "password": "wonderland"}],
        }
    )
    assert set(docs) == {"ConfigMap", "Secret", "Service", "Deployment"}
    deployment = docs["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    check_workload(docs, "Deployment")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TRIMARAN_QUEUES__SHARED"]["value"] == "true"
    assert json.loads(docs["Secret"]["stringData"]["users"]) == [{"name": "alice", "password": "wonderland"}]


def test_checked_in_manifests_are_the_chart_rendered() -> None:
    checked_in = (DEPLOY / "kubernetes" / "trimaran.yaml").read_text()
    rendered = subprocess.run(
        [sys.executable, "-m", "tests.support.helm"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    assert checked_in == rendered, (
        "regenerate: python -m tests.support.helm > deploy/kubernetes/trimaran.yaml"
    )


def test_template_subset_refuses_what_it_does_not_know() -> None:
    with pytest.raises(helm.TemplateError):
        helm.render('{{ include "x" . }}', {"Values": {}})
    with pytest.raises(helm.TemplateError):
        helm.render("{{ .Values.missing }}", {"Values": {}})
    assert (
        helm.render('a{{- if eq .Values.m "x" }} yes{{- else }} no{{- end }}', {"Values": {"m": "x"}})
        == "a yes"
    )


# -- systemd ----------------------------------------------------------------------------------------


def test_systemd_unit_is_hardened_and_consistent() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "trimaran.service")
    service = unit["Service"]
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert service[key] == value, key
    sysusers = (DEPLOY / "systemd" / "trimaran.sysusers").read_text()
    assert re.search(rf"^u {service['User']} ", sysusers, re.M)
    tmpfiles = (DEPLOY / "systemd" / "trimaran.tmpfiles").read_text()
    state = f"/var/lib/{service['StateDirectory']}"
    assert service["WorkingDirectory"] == state
    env = dict(pair.split("=", 1) for pair in shlex.split(service["Environment"]))
    assert str(settings_with_env(env).storage.data_dir) == state
    for key in ("ExecStart", "ExecStartPre"):
        program, *argv = shlex.split(service[key])
        assert program.endswith("/bin/trimaran")
        cli_accepts(argv)
        config = Path(argv[argv.index("--config") + 1])
        assert re.search(rf"^d {config.parent} \d+ root {service['Group']} ", tmpfiles, re.M)
        assert str(config.parent) in service["ReadOnlyPaths"]
    assert service["RestartPreventExitStatus"] == "2"  # a setting to fix, not a crash
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"  # SIGHUP reloads users and rules


# -- Grafana ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The sample names a server with traffic, a queue, a storage commit and a webhook exposes."""
    import urllib.request

    env = {
        "TRIMARAN_HTTP__TOKENS": '["t"]',
        "TRIMARAN_WEBHOOKS__ENDPOINTS": '[{"url": "http://127.0.0.1:9/hook"}]',
        "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
        "TRIMARAN_LIMITS__MAX_CONNECTIONS_PER_ADDRESS": "1",
    }
    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "127.0.0.1:0"]
    server = RunningServer(args, cwd=tmp_path_factory.mktemp("grafana"), env=env).start()
    try:
        base = f"http://127.0.0.1:{server.ports['http']}"

        def post(path: str, body: dict[str, Any]) -> None:
            request = urllib.request.Request(base + path, json.dumps(body).encode(), method="POST")
            request.add_header("authorization", "Bearer t")
            request.add_header("content-type", "application/json")
            urllib.request.urlopen(request, timeout=10).read()

        post("/api/v1/queues", {"name": "graphed"})
        post("/api/v1/publish", {"topic": "$queue/graphed", "payload": "x"})
        post("/api/v1/publish", {"topic": "a/b", "payload": "x"})
        consumer = connect(Endpoints("127.0.0.1", server.ports["mqtt"]), "grafana-consumer", version=V5)
        try:
            consumer.subscribe("$queue/graphed", qos=1)  # a consumer group: lag, pending, consumers
            with socket.create_connection(("127.0.0.1", server.ports["mqtt"])) as second:
                second.settimeout(5)  # a second connection from one address is refused
                assert second.recv(1) == b""
            time.sleep(0.2)
            text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        finally:
            consumer.client.loop_stop()
    finally:
        assert server.stop() == 0
    from prometheus_client.parser import text_string_to_metric_families

    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_grafana_dashboard_uses_only_metrics_the_server_exposes(scraped: set[str]) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "trimaran.json").read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(expressions) >= 20
    used = {name for expr in expressions for name in re.findall(r"\b((?:trimaran|process|python)_\w+)", expr)}
    missing = used - scraped
    assert not missing, f"the dashboard asks for metrics the server does not expose: {sorted(missing)}"
    for needed in ("process_cpu_seconds_total", "trimaran_queue_depth", "trimaran_connections_refused_total"):
        assert needed in used
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
