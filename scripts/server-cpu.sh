# Sourced by scripts/steady-floor and scripts/enqueue-levers: one pgbench run measured the way
# `bench offered-load` and the peers measure (every child of the postmaster over the window,
# ../shared/peers/lib/pgcpu.py).
#
#   server_cpu_per_tx LABEL DB SCRIPT PROTOCOL RATE DURATION
# runs pgbench SCRIPT on database DB with PROTOCOL (-M) from 4 clients offering RATE
# transactions/s (-R, open loop) for DURATION s, under PGSSLMODE (default prefer), and prints
# LABEL, the TLS mode, the transactions done and µs of server CPU per transaction (all classes
# but other databases'; the backends' share and the server processes' in brackets).

server_cpu_per_tx() {
  local label=$1 db=$2 script=$3 protocol=$4 rate=$5 duration=$6
  local sslmode=${PGSSLMODE:-prefer} pgcpu postmaster ready done_tx cpu
  pgcpu="$(dirname "${BASH_SOURCE[0]}")/../../shared/peers/lib/pgcpu.py"
  postmaster=$(head -1 "$(psql -h 127.0.0.1 -U postgres -X -d "$db" -Atc 'SHOW data_directory')/postmaster.pid")
  coproc sampler { python3 "$pgcpu" --postmaster "$postmaster" --db "$db"; }
  read -r ready <&"${sampler[0]}"
  [ "$ready" = ready ] || { echo "pgcpu.py did not start: $ready" >&2; return 1; }
  done_tx=$(PGSSLMODE=$sslmode pgbench -h 127.0.0.1 -U postgres -n -M "$protocol" -c 4 -j 2 \
    -R "$rate" -T "$duration" -f "$script" "$db" 2>/dev/null |
    awk '/number of transactions actually processed/ {print $NF}' | cut -d/ -f1)
  echo >&"${sampler[1]}"
  cpu=$(cat <&"${sampler[0]}")
  wait "$sampler_PID" || true
  python3 - "$label" "$sslmode" "$done_tx" "$cpu" <<'EOF'
import json, sys
label, ssl, n, cpu = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
c = cpu["classes"]
total = c["db"] + c["aux"] + c["other"]
print(f"{label:10} {ssl:8} {n} transactions: {total * 1e6 / n:6.1f} µs of server CPU each "
      f"(backends {c['db'] * 1e6 / n:.1f}, server processes {c['aux'] * 1e6 / n:.1f})")
EOF
}
