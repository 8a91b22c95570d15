-- in-flight: duplicates of a key whose first request is still at the processor.
--
-- The service calls a card-sim that answers after 500 ms. All threads and connections use
-- the key of the current 400 ms window of the wall clock (<prefix>-<window>): the first
-- request of a window claims the key and is held at the processor past the window's end, so
-- every other request of that window is a duplicate in flight and gets 409 (counted as
-- expected). The claiming requests (one per window) get 201. Any other status is an error.
local common = require "common"
local ffi = require "ffi"

ffi.cdef [[
   typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
   int clock_gettime(int clock_id, bench_timespec *tp);
]]
local CLOCK_REALTIME = 0
local WINDOW_MS = 400
local now = ffi.new("bench_timespec")

local prefix
expected_count = 0
unexpected_count = 0

function init(args)
   prefix = args[1] or "in-flight"
end

local function window()
   ffi.C.clock_gettime(CLOCK_REALTIME, now)
   return math.floor((tonumber(now.tv_sec) * 1000 + tonumber(now.tv_nsec) / 1e6) / WINDOW_MS)
end

function request()
   local headers = common.keyed_headers(prefix .. "-" .. window())
   return wrk.format("POST", "/charges", headers, common.charge_body)
end

function response(status, headers, body)
   if status == 409 then
      expected_count = expected_count + 1
   elseif status ~= 201 then
      unexpected_count = unexpected_count + 1
   end
end

setup = common.setup
done = common.done
