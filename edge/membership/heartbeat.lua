-- One edge instance's heartbeat, atomic: drop members whose TTL ran out (by Redis's own clock, so
-- the instances' clocks do not matter), write this member's claim and expiry (or remove it when it
-- leaves), and return every live member's claim.
-- KEYS[1] = sorted set member -> expiry (ms), KEYS[2] = hash member -> claim; one hash tag.
-- ARGV = member id, claim, ttl_ms, "1" to leave, key lifetime (ms) once the fleet is gone.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #dead > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('HDEL', KEYS[2], unpack(dead))
end
if ARGV[4] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
return redis.call('HGETALL', KEYS[2])
