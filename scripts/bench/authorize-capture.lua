-- authorize-capture: a hold (POST /charges with "capture": false) under a key no request has
-- used before, then its capture (POST /charges/{id}/capture) under a key of its own, as soon
-- as the hold's 201 names its charge: every request runs an effect's whole flow (claim,
-- processor, finish), a hold's or a capture's, in about equal numbers. A thread sends the
-- captures of its holds before any new hold, so the holds left uncaptured at the end are at
-- most the requests in flight when wrk stops.
--
-- Keys are <run prefix>-<thread>-<counter> for holds and <run prefix>-<thread>-capture-<charge>
-- for their captures.
-- The 201s of holds and the 200s of captures are counted as expected, anything else as
-- unexpected.
local common = require "common"

local prefix
local counter = 0
local held = {}
expected_count = 0
unexpected_count = 0

local HOLD_BODY = '{"amount":100,"currency":"usd","source":"tok_visa","capture":false}'

function init(args)
   prefix = string.format("%s-%d", args[1] or "hold", thread_id or 0)
end

function request()
   local charge = table.remove(held)
   if charge then
      local headers = common.keyed_headers(prefix .. "-capture-" .. charge)
      return wrk.format("POST", "/charges/" .. charge .. "/capture", headers, "{}")
   end
   counter = counter + 1
   local headers = common.keyed_headers(prefix .. "-" .. counter)
   return wrk.format("POST", "/charges", headers, HOLD_BODY)
end

function response(status, headers, body)
   if status == 201 then
      local charge = string.match(body, '"id":"(ch_[^"]+)"')
      if charge and string.find(body, '"status":"requires_capture"', 1, true) then
         held[#held + 1] = charge
         expected_count = expected_count + 1
      else
         unexpected_count = unexpected_count + 1
      end
   elseif status == 200 and string.find(body, '"captured":true', 1, true) then
      expected_count = expected_count + 1
   else
      unexpected_count = unexpected_count + 1
   end
end

setup = common.setup
done = common.done
