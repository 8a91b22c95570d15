-- replay-cache and replay-db: POST /charges with ONE key (wrk's first script argument) whose
-- charge bench.sh completed before the run, and the same body: every request is a replay.
-- Whether it comes from Redis or from PostgreSQL depends on how the service was started.
local common = require "common"

wrk.method = "POST"
wrk.body = common.charge_body
for name, value in pairs(common.charge_headers) do
   wrk.headers[name] = value
end

function init(args)
   wrk.headers["Idempotency-Key"] = args[1]
end

setup = common.setup
done = common.done
