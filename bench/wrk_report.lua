-- wrk prints its own summary; this adds one JSON line the benchmark reads:
-- the counts, and every latency seen as [microseconds, how many times], so
-- that percentiles can be taken over the requests of several runs together.
done = function(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  local seen = {}
  for i = 1, #latency do
    local value, count = latency(i)
    seen[#seen + 1] = string.format("[%d,%d]", value, count)
  end
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "errors": %d, "non_2xx": %d, "latency_us": [%s]}\n',
    summary.requests, summary.duration, errors, summary.errors.status, table.concat(seen, ",")))
end
