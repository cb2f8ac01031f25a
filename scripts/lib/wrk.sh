# Sourced by the wrk benchmarks (bench-proxy.sh, bench-ab.sh, bench-scaling.sh), from the
# repository root: the chat bodies they all send, and what they read from wrk's report.
#
#   wrk_chat_script FILE WORDS WORD     writes the wrk script to FILE: 16 distinct chat bodies
#                                       cycled per request, each a system prompt of WORDS words
#                                       (WORD0..WORD996, shared by all 16) before its question
#   wrk_read REPORT                     from `wrk --latency`'s REPORT: WRK_RPS, WRK_P50, WRK_P99,
#                                       WRK_NON2XX (0 when there were none) and WRK_REQUESTS

wrk_chat_script() {
  cat >"$1" <<EOF
local system_words = $2
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local words = {}
for i = 1, system_words do words[i] = "$3" .. (i % 997) end
local system = "You are a helpful assistant. " .. table.concat(words, " ")
local bodies = {}
for i = 1, 16 do
  bodies[i] = string.format('{"model":"sim-model","messages":[{"role":"system","content":"%s"},{"role":"user","content":"Question %d: summarize the plot of a short story about a lighthouse keeper in one sentence."}],"max_tokens":8}', system, i)
end
local n = 0
request = function()
  n = n % #bodies + 1
  return wrk.format(nil, "/v1/chat/completions", nil, bodies[n])
end
EOF
}

wrk_read() {
  WRK_RPS="$(awk '/Requests\/sec/ {print $2}' <<<"$1")"
  WRK_P50="$(awk '$1=="50%" {print $2}' <<<"$1")"
  WRK_P99="$(awk '$1=="99%" {print $2}' <<<"$1")"
  WRK_NON2XX="$(awk '/Non-2xx/ {print $4}' <<<"$1")"
  WRK_NON2XX="${WRK_NON2XX:-0}"
  WRK_REQUESTS="$(awk '/requests in/ {print $1}' <<<"$1")"
}
