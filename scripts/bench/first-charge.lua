-- first-charge: POST /charges with a key no request has used before, so every request runs
-- the whole flow (claim, processor, record charged, finish, cache).
--
-- Keys are <run prefix>-<thread>-<counter>: the prefix (wrk's first script argument) is new
-- for every run, the thread number keeps threads apart, and the counter requests apart.
local common = require "common"

local prefix
local counter = 0

function init(args)
   prefix = string.format("%s-%d", args[1] or "first", thread_id or 0)
end

function request()
   counter = counter + 1
   local headers = common.keyed_headers(prefix .. "-" .. counter)
   return wrk.format("POST", "/charges", headers, common.charge_body)
end

setup = common.setup
done = common.done
