-- GET of the URL given to wrk: floor-http (/healthz) and floor-redis (/bench/redis).
local common = require "common"

wrk.method = "GET"

setup = common.setup
done = common.done
