-- Finish a request, atomically: free its slot and refund its unused tokens (GCRA: move the TAT
-- back), and the request itself when it never ran. Only the call that removes the slot refunds,
-- so it is idempotent. Mirrors limiter/policy.py:settle. It marks the request's record 'done' (for
-- the slot's lifetime), so that its admit, should it run only now (sent before a stall, executed
-- after), takes no slot (admit.lua refuses a settled request) and a cancel of it from now on answers
-- "finished"; and it reports whether the record said 'cancelled' before: the fleet's cancel
-- (edge/cancel/bus.py) marks a running request so, and its stream must then end cancelled.
-- KEYS: requests TAT, tokens TAT, concurrency set, the request's record (one {user} hash tag)
-- ARGV: now_override_us ('' = Redis TIME; tests only), request_id, token_window_us, refund_tokens,
--       request_window_us, refund_request (0/1), lease_ttl_us, token_capacity, request_capacity
-- Returns: {1 when this call removed the slot else 0, 1 when a cancel had marked the record else 0}.

local token_window = tonumber(ARGV[3])
local refund = tonumber(ARGV[4])
local request_window = tonumber(ARGV[5])
local token_capacity = tonumber(ARGV[8])
local request_capacity = tonumber(ARGV[9])

local function move_back(key, by)
  local tat = tonumber(redis.call('GET', key)) or 0
  tat = math.max(tat - by, now)
  redis.call('SET', key, string.format('%d', tat), 'PX', math.floor((tat - now + 999) / 1000) + EXPIRY_MARGIN_MS)
end

local cancelled = 0
if redis.call('GET', KEYS[4]) == 'cancelled' then
  cancelled = 1
end
redis.call('SET', KEYS[4], 'done', 'PX', math.floor((tonumber(ARGV[7]) + 999) / 1000) + EXPIRY_MARGIN_MS)
-- A lapsed slot (past its lease, not yet pruned by an admit) is removed but refunds nothing, as
-- one an admit pruned first: which came first must not decide the refund.
local expiry = redis.call('ZSCORE', KEYS[3], ARGV[2])
if redis.call('ZREM', KEYS[3], ARGV[2]) == 0 or tonumber(expiry) <= now then
  return {0, cancelled}
end
if refund > 0 then
  move_back(KEYS[2], span(refund, token_window, token_capacity))
end
if ARGV[6] == '1' then
  move_back(KEYS[1], span(1, request_window, request_capacity))
end
return {1, cancelled}
