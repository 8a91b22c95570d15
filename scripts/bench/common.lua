-- Shared by every scenario script: thread numbering, and one parseable result line.
--
-- wrk runs setup() and done() in its main Lua state and every other function in one state
-- per thread; values cross between them only through thread:set() / thread:get().

local M = {}

local threads = {}

-- Numbers the threads (so each can build keys no other thread uses) and keeps them, so that
-- done() can add up their counters.
function M.setup(thread)
   threads[#threads + 1] = thread
   thread:set("thread_id", #threads)
end

-- Sums a numeric global that the scenario's threads kept (0 when none did).
local function sum(name)
   local total = 0
   for _, thread in ipairs(threads) do
      total = total + (tonumber(thread:get(name)) or 0)
   end
   return total
end

-- Prints one line that scripts/bench.sh parses:
--   BENCH requests=N duration_s=F rps=F p50_ms=F p99_ms=F max_ms=F non2xx=N
--         connect=N read=N write=N timeout=N expected=N unexpected=N
-- non2xx is wrk's own count of responses with a status of 400 or more; expected and
-- unexpected are the scenario's own counts of statuses it checks (0 when it checks none).
function M.done(summary, latency, requests)
   local seconds = summary.duration / 1e6
   local e = summary.errors
   io.write(string.format(
      "BENCH requests=%d duration_s=%.3f rps=%.1f p50_ms=%.3f p99_ms=%.3f max_ms=%.3f "
         .. "non2xx=%d connect=%d read=%d write=%d timeout=%d expected=%d unexpected=%d\n",
      summary.requests, seconds, summary.requests / seconds,
      latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
      e.status, e.connect, e.read, e.write, e.timeout,
      sum("expected_count"), sum("unexpected_count")))
end

M.charge_body = '{"amount":100,"currency":"usd","source":"tok_visa"}'

M.charge_headers = {
   ["Authorization"] = "Bearer sk_test_acme",
   ["Content-Type"] = "application/json",
}

-- The headers of a POST under the idempotency key `key`: a table of its own per request.
function M.keyed_headers(key)
   local headers = { ["Idempotency-Key"] = key }
   for name, value in pairs(M.charge_headers) do
      headers[name] = value
   end
   return headers
end

return M
