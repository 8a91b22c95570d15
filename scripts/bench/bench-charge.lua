-- floor-charge: POST /bench/charge writes a charge, its ledger transaction and its outbox
-- event in one transaction, with no idempotency record and no processor call. The request is
-- the same every time, so wrk builds it once.
local common = require "common"

wrk.method = "POST"
wrk.body = common.charge_body
wrk.headers["Content-Type"] = "application/json"

setup = common.setup
done = common.done
