-- wrk script: POST a fixed OIP v2 inference body to every request.
--   BODY_FILE=body_oip.json wrk -s bench/replica/post_oip.lua \
--       http://127.0.0.1:PORT/v2/models/NAME/infer
-- The URL's path is used as is; if it is "/" and MODEL_NAME is set, the path becomes
-- /v2/models/$MODEL_NAME/infer. Works unchanged against flotilla and python_server.py.
local path = os.getenv("BODY_FILE")
if path == nil or path == "" then
  error("set BODY_FILE to a file holding the request body")
end
local f = assert(io.open(path, "rb"))
local body = f:read("*a")
f:close()

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"

local model = os.getenv("MODEL_NAME")
if (wrk.path == nil or wrk.path == "/") and model ~= nil and model ~= "" then
  wrk.path = "/v2/models/" .. model .. "/infer"
end
