#!/usr/bin/env bash
# `make compose-smoke`: the compose journey as a person takes it, start to finish, then nothing left behind.
#
#   build    the xdc image (docker compose build; bases from compose/.env, see compose/setup.sh)
#   up       `docker compose up` in the foreground, as a person runs it (its output to RUN/up.log):
#            toxiproxy, init, sampler (energy telemetry; healthy after its idle baseline), store,
#            coordinator, site-a/b/c and finish; it must return by itself, exit 0, when the run ends
#   chaos    the scenario from the host: `xdc chaos SCENARIO --run RUN` (a compose run is recognised
#            by its topology: kill / pause / restart through the Docker CLI), attached at once
#   probe    from inside site-a: no other process is reachable by name or by IP, nor Toxiproxy's API;
#            Toxiproxy's proxies are (compose/netprobe.py -> RUN/netprobe.json)
#   finish   the `finish` service ends the run as the launcher does (stop requests), reads Toxiproxy's
#            counters, writes the summary, artifact and report into the bound runs directory
#   check    compose/smoke_check.py on the artifact (target reached, every checker passing, bytes
#            reconciled with Toxiproxy, the sampler's trace whole and its energy `unavailable` with
#            the reason, the probe's findings, what `up` printed: a commit line with a loss, the
#            completion, the final NLL, a report path that exists on the host; with
#            SMOKE_NATIVE=<native run dir>, the same matched-frontier hash as that native run)
#   down     docker compose down --volumes, then no container, network or volume of the project
#
# The run directory is ./runs/$SMOKE_RUN (the services bind ./runs); the timings of each step go to
# RUN/compose-smoke.json. Run from the repository root (the Makefile does).
# Environment: SMOKE_RUN, SMOKE_SCENARIO, SMOKE_NATIVE (optional), SMOKE_RUN_TIMEOUT_S (900),
# BIN (the venv's bin).
set -euo pipefail

SMOKE_RUN=${SMOKE_RUN:?set SMOKE_RUN}
SMOKE_SCENARIO=${SMOKE_SCENARIO:-scenarios/compose-smoke.yaml}
SMOKE_NATIVE=${SMOKE_NATIVE:-}
BIN=${BIN:-.venv/bin}
PROJECT=xdc
RUN_DIR=runs/$SMOKE_RUN
COMPOSE=(docker compose -f compose/docker-compose.yml)

say() { echo "compose-smoke: $*"; }
die() { echo "compose-smoke: error: $*" >&2; exit 1; }
now_ns() { date +%s%N; }

docker info >/dev/null 2>&1 || die "needs a running Docker engine (docker info failed): run \`make compose-setup\`"
docker compose version >/dev/null 2>&1 || die "needs the docker compose plugin: run \`make compose-setup\`"
[ -f compose/.env ] || die "compose/.env is missing: run \`make compose-setup\`"
set -a; . compose/.env; set +a  # the image names this machine uses
"$BIN/xdc" compose generate --check

# The containers run as the caller, so the run directory is the caller's; but never as root (a root
# process in a container is root on the files it can reach). Root's run directory is handed to the
# image's own user instead.
uid=$(id -u)
[ "$uid" != 0 ] || uid=10001
export XDC_RUN_ID=$SMOKE_RUN XDC_RUNS_DIR=$PWD/runs XDC_UID=$uid
# Toxiproxy's API on a free loopback port (8474 may be taken by a native run on the same machine).
export XDC_TOXIPROXY_API_PORT=${XDC_TOXIPROXY_API_PORT:-$("$BIN/python" -c \
  'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

leftovers() {  # everything of the project the engine still has, one per line
  local kind
  docker ps -a -q --filter "label=com.docker.compose.project=$PROJECT" | sed 's/^/container /'
  for kind in network volume; do
    docker "$kind" ls -q --filter "label=com.docker.compose.project=$PROJECT" | sed "s/^/$kind /"
  done
}

before=$(leftovers)
if [ -n "$before" ]; then  # a smoke that was interrupted before its teardown
  say "removing what an earlier run of project $PROJECT left: $(echo $before)"
  "${COMPOSE[@]}" down --volumes --remove-orphans --timeout 5 >/dev/null 2>&1 || true
fi

mkdir -p runs
[ ! -e "$RUN_DIR" ] || die "$RUN_DIR exists already: choose another SMOKE_RUN"
install -d -o "$uid" "$RUN_DIR"

teardown() {
  local rc=$? t=$(now_ns)
  [ -z "${up_pid:-}" ] || kill "$up_pid" 2>/dev/null || true
  # The journey's own last command: nothing of the project may be left after it.
  "${COMPOSE[@]}" down --volumes --timeout 5 >/dev/null 2>&1 || true
  local left
  left=$(leftovers)
  if [ -n "$left" ]; then echo "compose-smoke: error: left behind after down --volumes: $left" >&2; rc=1; fi
  if [ -f "$RUN_DIR/compose-smoke.json" ]; then
    "$BIN/python" - "$RUN_DIR/compose-smoke.json" "$(( ($(now_ns) - t) / 1000000 ))" "$left" <<'EOF'
import json, sys
p, down_ms, left = sys.argv[1], int(sys.argv[2]), sys.argv[3]
d = json.load(open(p))
d["timings_s"]["down"] = down_ms / 1000
d["left_behind"] = [l for l in left.splitlines() if l]
json.dump(d, open(p, "w"), indent=1, sort_keys=True)
EOF
  fi
  exit $rc
}
trap teardown EXIT

t_start=$(now_ns)
say "build"
"${COMPOSE[@]}" build --quiet init
t_built=$(now_ns)
# The image this build replaced, if any, is dangling now: drop it (only images of this project).
docker image prune -f --filter label=org.xdc.project=xdc >/dev/null
say "up (run $SMOKE_RUN), in the foreground as a person runs it; output in $RUN_DIR/up.log"
"${COMPOSE[@]}" up --quiet-pull > "$RUN_DIR/up.log" 2>&1 &
up_pid=$!
# The chaos driver attaches at once (it waits for the run's topology), while the sites are still
# importing torch: started later, it raced the run on an idle machine. It returns when the
# coordinator has exited by itself; a run that never ends fails the smoke.
say "chaos from the host: xdc chaos $SMOKE_SCENARIO --run $RUN_DIR"
timeout "${SMOKE_RUN_TIMEOUT_S:-900}" "$BIN/xdc" chaos "$SMOKE_SCENARIO" --run "$RUN_DIR" &
chaos_pid=$!
# site-a running (then the probe can exec into it)
site_a=""
for _ in $(seq 1 600); do
  site_a=$("${COMPOSE[@]}" ps -q --status running site-a 2>/dev/null || true)
  [ -n "$site_a" ] && break
  kill -0 "$up_pid" 2>/dev/null || die "docker compose up ended before site-a ran: $(tail -c 2000 "$RUN_DIR/up.log")"
  sleep 0.5
done
[ -n "$site_a" ] || die "site-a did not start within 300 s"
t_up=$(now_ns)

# From inside site-a: other processes by name and by IP (each on its own network), and the way out.
ip_of() {
  docker inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' \
    "$("${COMPOSE[@]}" ps -q "$1")" | awk '{print $1}'
}
probe_args=(--via "toxiproxy:$("$BIN/python" -c "import json; print(json.load(open('$RUN_DIR/topology.json'))['links']['a_to_b']['listen'].split(':')[1])")")
probe_args+=(--api toxiproxy:8474 --api toxiproxy-api:8474)  # the API: on the control network only
for svc in site-b site-c coordinator store; do
  probe_args+=(--name "$svc" --ip "$svc=$(ip_of "$svc")")
done
# Beyond the project: the host's DNS server (an address the host itself uses), when it is not loopback.
for ns in $(awk '$1 == "nameserver" && $2 !~ /^127\./ && $2 !~ /:/ {print $2}' /etc/resolv.conf | head -1); do
  probe_args+=(--outside "$ns:53")
done
# `docker exec` without -i on the container, stdin from /dev/null (compose's exec attaches stdin by
# default; nothing here reads it). The probe's attempts run at once (~7 s at most) and the run
# (compose/run.yaml: 1,179,648 tokens, over a minute on any host) keeps site-a up well past that.
probe_rc=0
timeout 60 docker exec "$site_a" python /app/compose/netprobe.py "${probe_args[@]}" \
  < /dev/null > "$RUN_DIR/netprobe.json" 2> "$RUN_DIR/netprobe.stderr" || probe_rc=$?
if [ "$probe_rc" != 0 ]; then
  state=$(docker inspect --format '{{.State.Status}}' "$site_a" 2>/dev/null || echo gone)
  die "the network probe from inside site-a failed or hung (exit $probe_rc; site-a is $state; stderr: $(tail -c 400 "$RUN_DIR/netprobe.stderr"))"
fi
say "probe from site-a: $(tr -d '\n ' < "$RUN_DIR/netprobe.json" | cut -c1-160)..."
# The networks as the engine has them: internal or not, and which services are attached.
for net in $(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT"); do
  docker network inspect --format '{{index .Labels "com.docker.compose.network"}} {{.Internal}} {{range .Containers}}{{.Name}} {{end}}' "$net"
done | "$BIN/python" -c '
import json, re, sys
nets = {}
for line in sys.stdin:
    name, internal, *containers = line.split()
    nets[name] = {"internal": internal == "true",
                  "services": sorted(re.sub(r"^xdc[-_](.*)[-_]\d+$", r"\1", c) for c in containers)}
json.dump(nets, open(sys.argv[1], "w"), indent=1, sort_keys=True)' "$RUN_DIR/networks.json"

wait "$chaos_pid" \
  || die "xdc chaos failed or the run did not end within ${SMOKE_RUN_TIMEOUT_S:-900} s (exit $?)"
# `up` returns by itself once the run is over: the finish service stops what still runs, writes the
# summary, the artifact and the report, and exits; then no attached service runs.
up_rc=0
for _ in $(seq 1 600); do kill -0 "$up_pid" 2>/dev/null || break; sleep 0.5; done
kill -0 "$up_pid" 2>/dev/null && die "docker compose up did not return within 300 s of the run's end: $(tail -c 2000 "$RUN_DIR/up.log")"
wait "$up_pid" || up_rc=$?
up_pid=""
[ "$up_rc" = 0 ] || die "docker compose up exited $up_rc: $(tail -c 3000 "$RUN_DIR/up.log")"
t_ran=$(now_ns)
say "up returned 0; its last lines:"
tail -n 8 "$RUN_DIR/up.log" | sed 's/^/  /'
t_analyzed=$t_ran

"$BIN/python" - "$RUN_DIR" "$t_start" "$t_built" "$t_up" "$t_ran" "$t_analyzed" <<'EOF'
import json, sys
from pathlib import Path
run, t0, built, up, ran, analyzed = Path(sys.argv[1]), *map(int, sys.argv[2:])
coord = [json.loads(l) for l in (run / "logs" / "coord.jsonl").open() if l.strip()]
first_commit = next((e["wall_ns"] for e in coord if e["event"] == "commit"), None)
coord_done = next((e["wall_ns"] for e in reversed(coord) if e["event"] == "coordinator_stopped"), None)
# run: site-a running -> the coordinator stopped; finish: -> `up` returned (stop the rest, summary, report)
t = {"build": (built - t0) / 1e9, "up": (up - built) / 1e9,
     "run": None if coord_done is None else (coord_done - up) / 1e9,
     "finish": None if coord_done is None else (ran - coord_done) / 1e9, "smoke_before_down": (analyzed - t0) / 1e9,
     "up_to_first_commit": None if first_commit is None else (first_commit - built) / 1e9}
json.dump({"run": run.name, "timings_s": t}, open(run / "compose-smoke.json", "w"), indent=1, sort_keys=True)
print("compose-smoke: timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in t.items() if v is not None))
EOF
"$BIN/python" compose/smoke_check.py "$RUN_DIR" --up-log "$RUN_DIR/up.log" ${SMOKE_NATIVE:+--native "$SMOKE_NATIVE"}
