-- wrk script: POST a fixed MLflow scoring body (dataframe_split / instances) to every
-- request.
--   BODY_FILE=body_mlflow.json wrk -s bench/replica/post_mlflow.lua \
--       http://127.0.0.1:PORT/invocations
-- If the URL's path is "/", /invocations is used. Works unchanged against flotilla and
-- python_server.py.
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

if wrk.path == nil or wrk.path == "/" then
  wrk.path = "/invocations"
end
