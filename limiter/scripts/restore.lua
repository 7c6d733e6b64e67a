-- After a store outage: put back what this edge instance admitted on its local fallback meanwhile,
-- atomically, before it admits on Redis again. Without it, requests admitted while Redis was down
-- (or lost with a restarted Redis) would not count there, and Redis would admit as many again.
-- Takes the later of each TAT (what Redis counted, what this instance counted) and adds the running
-- requests' slots that Redis does not hold. Idempotent: restoring twice changes nothing more.
-- A request settled meanwhile (its record is 'done'; 'cancelled' is a request still running) gets
-- no slot back.
-- KEYS: requests TAT, tokens TAT, concurrency set, then each running request's record
--       (one {user} hash tag)
-- ARGV: now_override_us ('' = Redis TIME; tests only), request_ahead_us, token_ahead_us,
--       lease_ttl_us, then the running requests' ids
local request_ahead = tonumber(ARGV[2])
local token_ahead = tonumber(ARGV[3])
local lease_ttl = tonumber(ARGV[4])

local function at_least(key, ahead)
  if ahead <= 0 then
    return
  end
  local tat = tonumber(redis.call('GET', key)) or 0
  if tat < now + ahead then
    tat = now + ahead
    redis.call('SET', key, string.format('%d', tat), 'PX', math.floor((ahead + 999) / 1000) + EXPIRY_MARGIN_MS)
  end
end

at_least(KEYS[1], request_ahead)
at_least(KEYS[2], token_ahead)
if #ARGV > 4 then
  local expiry = string.format('%d', now + lease_ttl)
  for i = 5, #ARGV do
    local record = redis.call('GET', KEYS[i - 1])
    if not record or record == 'cancelled' then
      redis.call('ZADD', KEYS[3], 'NX', expiry, ARGV[i])
    end
  end
  redis.call('PEXPIRE', KEYS[3], math.floor((lease_ttl + 999) / 1000) + EXPIRY_MARGIN_MS)
end
return 1
