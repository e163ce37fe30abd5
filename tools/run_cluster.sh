#!/bin/sh
# make run-cluster: a three-node holdfast cluster on loopback, for trying cluster mode.
# Node N (1..3) listens on the default ports plus 10*(N-1): memcached 11211/11221/11231,
# old 2626/2636/2646, dlock 2627/2637/2647, peers 2628/2638/2648, admin 2629/2639/2649,
# counters 11215/11225/11235. The data directories live in a temporary directory that is
# removed at the end. Ctrl-C stops the three daemons (this script started them; it signals
# only their PIDs).
set -eu
bin=${HOLDFAST:-./target/release/holdfast}
dir=$(mktemp -d "${TMPDIR:-/tmp}/holdfast-cluster.XXXXXX")
peers="1=127.0.0.1:2628,2=127.0.0.1:2638,3=127.0.0.1:2648"
pids=""
stop() {
    trap - INT TERM EXIT
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    rm -rf "$dir"
    echo "run-cluster: stopped; removed $dir"
}
trap stop INT TERM EXIT
for n in 1 2 3; do
    o=$((10 * (n - 1)))
    "$bin" --peers "$peers" --node-id "$n" --data-dir "$dir/node$n" \
        --memcache "127.0.0.1:$((11211 + o))" --lockd "127.0.0.1:$((2626 + o))" \
        --dlock "127.0.0.1:$((2627 + o))" --admin "127.0.0.1:$((2629 + o))" \
        --counter "127.0.0.1:$((11215 + o))" "$@" &
    pids="$pids $!"
done
echo "run-cluster: three nodes (PIDs$pids), data in $dir"
echo "  node 1: memcached 11211  old 2626  dlock 2627  peers 2628  admin 2629"
echo "  node 2: memcached 11221  old 2636  dlock 2637  peers 2638  admin 2639"
echo "  node 3: memcached 11231  old 2646  dlock 2647  peers 2648  admin 2649"
echo "run-cluster: Ctrl-C stops them"
wait
