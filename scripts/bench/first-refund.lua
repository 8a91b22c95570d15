-- first-refund: POST /charges/{id}/refunds of one minor unit with a key no request has used
-- before, so that every request runs a refund's whole flow (claim, reservation, processor,
-- finish), spread over the charges named in the second script argument (their ids, comma
-- separated) in turn.
--
-- Keys are <run prefix>-<thread>-<counter>, as in first-charge.lua.
local common = require "common"

local prefix
local charges = {}
local counter = 0

function init(args)
   prefix = string.format("%s-%d", args[1] or "refund", thread_id or 0)
   for id in string.gmatch(args[2] or "", "[^,]+") do
      charges[#charges + 1] = id
   end
   assert(#charges > 0, "first-refund.lua needs the charges' ids as its second argument")
end

function request()
   counter = counter + 1
   local headers = common.keyed_headers(prefix .. "-" .. counter)
   -- Threads start at different charges, so that they do not meet on the same one in step.
   local charge = charges[(counter + (thread_id or 0) * 7) % #charges + 1]
   return wrk.format("POST", "/charges/" .. charge .. "/refunds", headers, '{"amount":1}')
end

setup = common.setup
done = common.done
