# Shell helpers of the SDK tests (run.sh, agent.sh); sourced, with $tmp set.

# serve_start TAG MODEL ARGS...: starts keel serve MODEL ARGS on a free
# loopback port; sets $port and $pid (output in $tmp/TAG.out, $tmp/TAG.err).
# Returns 1, with the server's output printed, when it does not start.
serve_start() {
    tag=$1
    model=$2
    shift 2
    # emptied here, before the server starts: the redirections below happen
    # in the background child, and until then the loop would read the
    # previous server's "listening on" line under the same tag (its port,
    # closed: ECONNREFUSED, seen in parallel make test runs)
    : >"$tmp/$tag.out"
    : >"$tmp/$tag.err"
    "$KEEL_BIN" serve -m "$model" --host 127.0.0.1 --port 0 "$@" --log-disable >"$tmp/$tag.out" 2>"$tmp/$tag.err" &
    pid=$!
    port=""
    i=0
    while [ $i -lt 600 ]; do
        port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/$tag.out")
        [ -n "$port" ] && grep -q "keel serve: ready" "$tmp/$tag.out" && return 0
        if ! kill -0 "$pid" 2>/dev/null; then
            cat "$tmp/$tag.out" "$tmp/$tag.err"
            echo "server-clients: keel serve ($tag) exited"
            return 1
        fi
        sleep 0.1
        i=$((i + 1))
    done
    cat "$tmp/$tag.out" "$tmp/$tag.err"
    echo "server-clients: keel serve ($tag) did not start"
    return 1
}

# serve_stop TAG PID: SIGTERM, and the server must exit 0.
serve_stop() {
    kill -TERM "$2"
    wait "$2"
    rc_=$?
    cat "$tmp/$1.err"
    if [ $rc_ -ne 0 ]; then
        echo "server-clients: keel serve ($1) exited $rc_ after SIGTERM"
        return 1
    fi
    return 0
}
