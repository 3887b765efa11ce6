-- wrk prints its own summary; this adds one JSON line the benchmark reads.
done = function(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "errors": %d, "non_2xx": %d, "p50_us": %d, "p95_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, errors, summary.errors.status,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.max))
end
