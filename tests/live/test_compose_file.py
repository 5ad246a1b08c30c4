"""The compose cluster, checked without a Docker engine: the committed compose files are what the one
topology generates, they parse, every xdc command is real (run with --help), images/environment/volumes
agree with the topology, the GPU override reserves the GPU for every site, the Dockerfiles' bases are
pinned build args, and compose/missing_requirements.py names only what is absent. The topology-only
checks: tests/unit/test_compose_file.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from xdc.cli import main as xdc_main
from ground.topology import COMPOSE_TOXIPROXY, COORD, STORE, plan_topology, service_name
from xdc.compose import API_RELAY, BASE_IMAGE, DOCKER_CLI_IMAGE, TOXIPROXY_IMAGE, compose_spec
from tests.helpers_compose_file import COMPOSE, SITES, _env_default, _xdc_commands, doc  # noqa: F401  (doc: the fixture)

ROOT = Path(__file__).resolve().parents[2]


def test_committed_files_are_generated_from_the_topology(tmp_path: Path) -> None:
    assert xdc_main(["compose", "generate", "--check"]) == 0
    assert xdc_main(["compose", "generate", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "docker-compose.yml").read_text() == COMPOSE.read_text()
    assert (tmp_path / "docker-compose.gpu.yml").read_text() == (ROOT / "compose" / "docker-compose.gpu.yml").read_text()
    assert yaml.safe_load(COMPOSE.read_text()) == compose_spec(SITES)


def test_the_file_parses_and_has_every_service(doc: dict) -> None:
    svcs = doc["services"]
    assert set(svcs) == {COMPOSE_TOXIPROXY, API_RELAY, "init", "sampler", "store", "coordinator", "site-a", "site-b",
                         "site-c", "finish"}
    # pinned upstream images by default; `make compose-setup` may name local stand-ins in compose/.env
    assert svcs[COMPOSE_TOXIPROXY]["image"] == f"${{XDC_TOXIPROXY_IMAGE:-{TOXIPROXY_IMAGE}}}"
    assert re.fullmatch(r"ghcr\.io/shopify/toxiproxy:\d+\.\d+\.\d+", TOXIPROXY_IMAGE)
    args = svcs["init"]["build"]["args"]
    assert args["XDC_BASE_IMAGE"] == f"${{XDC_BASE_IMAGE:-{BASE_IMAGE}}}"
    assert args["XDC_DOCKER_CLI_IMAGE"] == f"${{XDC_DOCKER_CLI_IMAGE:-{DOCKER_CLI_IMAGE}}}"
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", BASE_IMAGE) and re.fullmatch(r"docker:\d+\.\d+\.\d+-cli", DOCKER_CLI_IMAGE)
    # named volumes: the secret keys' alone, one per process (removed by `down --volumes`); the runs
    # directory is the host's (bound)
    assert all(v.startswith("keys-") for v in doc["volumes"])
    for name in ("toxiproxy", "sampler", "store", "coordinator", "site-a", "site-b", "site-c"):
        assert "healthcheck" in svcs[name], name
    # no service on demand: `up` runs the whole journey, the end of the run included (`finish`)
    assert not any("profiles" in s for s in svcs.values())
    assert svcs["finish"]["depends_on"] == {"init": {"condition": "service_completed_successfully"}}
    # Toxiproxy (and its API's relay) are quiet and not attached: `up` shows the run and returns once the
    # attached services exited
    assert svcs[COMPOSE_TOXIPROXY]["attach"] is False and svcs[COMPOSE_TOXIPROXY]["environment"]["LOG_LEVEL"] == "info"
    assert svcs[API_RELAY]["attach"] is False
    assert all(s.get("attach", True) for n, s in svcs.items() if n not in (COMPOSE_TOXIPROXY, API_RELAY))
    # no service holds the Docker socket (chaos runs from the host)
    assert not any("docker.sock" in v for s in svcs.values() for v in s.get("volumes", []))


def test_every_command_is_a_real_xdc_command(doc: dict) -> None:
    cmds = _xdc_commands(doc)
    assert set(cmds) == set(doc["services"]) - {COMPOSE_TOXIPROXY, API_RELAY}
    assert (ROOT / doc["services"][API_RELAY]["command"][1].replace("/app/", "")).exists()  # the relay, copied
    for name, argv in cmds.items():
        sub = argv[1]
        r = subprocess.run([sys.executable, "-m", "xdc.cli", sub, *(["generate"] if sub == "compose" else []),
                            "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 0, (name, r.stderr)
        for flag in (a for a in argv[2:] if a.startswith("--")):
            assert flag in r.stdout, (name, flag)
    # files the commands name exist in the image (they are copied from the repository)
    assert (ROOT / _env_default("${XDC_CONFIG:-compose/run.yaml}")).exists()


def test_images_environment_volumes_agree(doc: dict) -> None:
    svcs = doc["services"]
    assert svcs[API_RELAY]["image"] == "${XDC_IMAGE:-xdc:local}" and "volumes" not in svcs[API_RELAY]
    xdc_svcs = [n for n in svcs if n not in (COMPOSE_TOXIPROXY, API_RELAY)]
    images = {svcs[n]["image"] for n in xdc_svcs}
    assert images == {"${XDC_IMAGE:-xdc:local}"}
    assert [n for n in xdc_svcs if "build" in svcs[n]] == ["init"]  # built once
    assert (ROOT / svcs["init"]["build"]["context"].replace("..", ".") / svcs["init"]["build"]["dockerfile"]).exists()
    for n in xdc_svcs:
        assert svcs[n]["volumes"][0] == "${XDC_RUNS_DIR:-../runs}:/runs", n
        assert svcs[n]["environment"]["XDC_RUN_ID"] == "${XDC_RUN_ID:-compose-run}", n
        assert svcs[n]["environment"]["XDC_NARRATE"] == "1", n  # one human line per event on stdout
        assert svcs[n]["restart"] == "no", n  # a killed site stays down until chaos restarts it
        assert any("/runs/${XDC_RUN_ID:-compose-run}" == a for a in svcs[n]["command"]), n
    # start order: init after toxiproxy is healthy; every process after init; sites after the services
    assert svcs["init"]["depends_on"][COMPOSE_TOXIPROXY]["condition"] == "service_healthy"
    for n in ("sampler", "store", "coordinator", "site-a", "site-b", "site-c"):
        assert svcs[n]["depends_on"]["init"]["condition"] == "service_completed_successfully"
    # the energy sampler first (its idle baseline before the run) and so, under `docker compose stop`, last
    for n in ("store", "coordinator"):
        assert svcs[n]["depends_on"]["sampler"]["condition"] == "service_healthy"
    assert "sampler_ready" in " ".join(svcs["sampler"]["healthcheck"]["test"])
    assert svcs["sampler"]["network_mode"] == "none" and "networks" not in svcs["sampler"]
    assert svcs["sampler"]["pid"] == f"service:{COMPOSE_TOXIPROXY}"  # it reads the CPU time of the processes
    for s in SITES:
        dep = svcs[service_name(s)]["depends_on"]
        assert dep["coordinator"]["condition"] == dep["store"]["condition"] == "service_healthy"
    # a restarted process gets a pid of its own (the logs name incarnations by pid): one PID namespace
    # for the project's processes, Toxiproxy's, never the host's (a container could see and signal its processes)
    for p in (COORD, STORE, *SITES):
        assert svcs[service_name(p)]["pid"] == f"service:{COMPOSE_TOXIPROXY}"
    assert not [n for n, s in svcs.items() if s.get("pid") == "host"]
    assert all("pid" not in svcs[n] for n in ("init", "finish", COMPOSE_TOXIPROXY))
    # the printed paths are the host's: the same directory the services bind
    assert svcs["finish"]["environment"]["XDC_HOST_RUNS_DIR"] == "${XDC_RUNS_DIR:-../runs}"
    # the health checks read the log file each process writes
    for p in (COORD, STORE, *SITES):
        assert f"/logs/{p}.jsonl" in " ".join(svcs[service_name(p)]["healthcheck"]["test"])


def test_gpu_override_reserves_the_gpu_for_every_site() -> None:
    gpu = yaml.safe_load((ROOT / "compose" / "docker-compose.gpu.yml").read_text())
    assert set(gpu["services"]) == {service_name(s) for s in SITES} | {"sampler"}  # the sampler reads NVML
    for s in gpu["services"].values():
        (dev,) = s["deploy"]["resources"]["reservations"]["devices"]
        assert dev["capabilities"] == ["gpu"] and dev["driver"] == "nvidia"


def test_dockerfile_bases_are_build_args_pinned_upstream_non_root() -> None:
    text = (ROOT / "compose" / "Dockerfile").read_text()
    assert f"ARG XDC_BASE_IMAGE={BASE_IMAGE}\n" in text and f"ARG XDC_DOCKER_CLI_IMAGE={DOCKER_CLI_IMAGE}\n" in text
    assert re.findall(r"^FROM (.+)$", text, re.M) == ["${XDC_DOCKER_CLI_IMAGE} AS dockercli", "${XDC_BASE_IMAGE}"]
    assert "COPY --from=dockercli /usr/local/bin/docker /usr/local/bin/docker" in text
    assert re.search(r"^USER \$\{XDC_UID\}$", text, re.M) and "ARG XDC_UID=10001" in text
    # only what the base lacks is installed; the project itself without an index
    assert "missing_requirements.py" in text and "--no-deps --no-build-isolation /app" in text
    for d in ("xdc", "coordinator", "site_agent", "wan", "checkpoint_store", "analysis", "chaos", "scenarios"):
        assert f"COPY {d} /app/{d}" in text


def test_missing_requirements_names_only_what_is_absent(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["pyyaml>=6", "pyyaml>=999", '
                                             '"no-such-dist-xdc>=1", "pytest[extra]>=1"]\n')
    r = subprocess.run([sys.executable, str(ROOT / "compose" / "missing_requirements.py"),
                        str(tmp_path / "pyproject.toml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["pyyaml>=999", "no-such-dist-xdc>=1"]
    r = subprocess.run([sys.executable, str(ROOT / "compose" / "missing_requirements.py"), str(ROOT / "pyproject.toml")],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout == ""  # this venv (what the local base image carries) lacks nothing


def test_no_service_but_its_owner_holds_a_secret_key(doc: dict) -> None:
    """Issue 54: every container could read every secret key in the shared runs directory. Now `init`
    alone writes the keys' volumes (and moves the keys out of the run directory); each process's
    service mounts its own key's volume alone, read-only, and reads its key there; no other service
    mounts one."""
    svcs = doc["services"]
    procs = plan_topology(SITES, "compose").processes()
    assert set(doc["volumes"]) == {f"keys-{p}" for p in procs}
    mounts = {n: [v for v in s.get("volumes", []) if v.startswith("keys-")] for n, s in svcs.items()}
    assert mounts.pop("init") == [f"keys-{p}:/keys/{i}" for i, p in enumerate(procs)]  # the order prepare deals in
    assert svcs["init"]["command"][-2:] == ["--secret-keys-out", "/keys"]
    owners = {service_name(p): p for p in procs}
    assert {n for n, m in mounts.items() if m} == set(owners)
    for n, p in owners.items():
        assert mounts[n] == [f"keys-{p}:/keys:ro"], n
        assert svcs[n]["environment"]["XDC_SECRET_KEYS_DIR"] == "/keys", n


def test_the_journal_and_the_store_are_written_by_their_owners_alone(doc: dict) -> None:
    """Issue 54: any container could write the coordinator's journal (which the store trusts for the
    announced epochs) and rewrite the store's files (its FRONTIER is a later study's start state). Every
    service that binds the runs directory has an empty tmpfs over the folders it does not own; the
    store reads the journal through a read-only bind."""
    svcs = doc["services"]
    run = "/runs/${XDC_RUN_ID:-compose-run}"
    binders = [n for n, s in svcs.items() if "${XDC_RUNS_DIR:-../runs}:/runs" in s.get("volumes", [])]
    assert set(binders) >= {"init", "sampler", "finish", "store", "coordinator", *(service_name(s) for s in SITES)}
    for n in binders:
        over = set(svcs[n].get("tmpfs", []))
        ro = {"/runs" + v[:-len(":ro")].split(":/runs", 1)[1] for v in svcs[n]["volumes"]
              if isinstance(v, str) and v.endswith(":ro") and v.startswith("${XDC_RUNS_DIR")}
        if n == "init":  # it makes both folders (cluster/launcher.py provision_run_dir), before anyone starts
            assert not over and not ro
        elif n == "coordinator":
            assert over == {f"{run}/store"} and not ro
        elif n == "store":
            assert not over and ro == {f"{run}/coordinator"}
        else:
            assert over == {f"{run}/coordinator", f"{run}/store"} and not ro, n
