-- Finish a request, atomically: free its slot and refund its unused tokens (GCRA: move the TAT
-- back), and the request itself when it never ran. Only the call that removes the slot refunds,
-- so it is idempotent. Mirrors limiter/policy.py:settle. It marks the request's record settled
-- (for the slot's lifetime), so that its admit, should it run only now (sent before a stall,
-- executed after), takes no slot (admit.lua refuses a settled request) and a cancel of it from now
-- on is answered as the request ended: 'done:cancelled' when a cancel ended it, whether the fleet's
-- cancel marked the record 'cancelled' (edge/cancel/bus.py: its stream must then end cancelled)
-- or the instance that ran it was cancelled there (ARGV[10]), so that a cancel repeated on any
-- instance answers "cancelled" again, as the first did; 'done' when it ended on its own ("finished").
-- It reports whether the record said cancelled before.
-- KEYS: requests TAT, tokens TAT, concurrency set, the request's record (one {user} hash tag)
-- ARGV: now_override_us ('' = Redis TIME; tests only), request_id, token_window_us, refund_tokens,
--       request_window_us, refund_request (0/1), lease_ttl_us, token_capacity, request_capacity,
--       cancelled here (0/1)
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

-- A settle sent again (its first answer lost) finds 'done:cancelled' if the first wrote it: cancelled.
local record = redis.call('GET', KEYS[4])
local cancelled = 0
if record == 'cancelled' or record == 'done:cancelled' then
  cancelled = 1
end
local settled = 'done'
if cancelled == 1 or ARGV[10] == '1' then
  settled = 'done:cancelled'
end
redis.call('SET', KEYS[4], settled, 'PX', math.floor((tonumber(ARGV[7]) + 999) / 1000) + EXPIRY_MARGIN_MS)
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
