# Sourced by the routing benchmarks (bench-routing.sh, bench-kv-events.sh), from the repository
# root, with $out (the output folder) set: `run NAME ARGS...` runs `replay compare ARGS` and
# keeps its table, JSON report and plot as $out/NAME.txt, .json and .svg.
replay=target/release/replay

run() {
    local name="$1"
    shift
    echo "== $name: replay compare $*" >&2
    "$replay" compare "$@" --no-progress --out "$out/$name.json" --plot "$out/$name.svg" \
        | tee "$out/$name.txt"
}
