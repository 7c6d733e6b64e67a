-- One edge instance's heartbeat, atomic: drop members whose TTL ran out (by Redis's own clock, so
-- the instances' clocks do not matter) and remember them as departed, write this member's claim
-- and expiry (or remove it when it leaves), and return every live member's claim and the departed.
-- A departed member is one that stopped beating (crashed, killed, cut off): its streams died with
-- it, so the others free its concurrency slots (limiter/scripts/admit.lua) by its tag, the part of
-- its id after the last ':' (edge/request_ids.py). It is remembered for as long as a slot lives
-- (ARGV[6]; longer, its slots expired anyway) or until it beats again. One that leaves says so
-- itself after its streams settled, and is not remembered.
-- KEYS[1] = sorted set member -> expiry (ms), KEYS[2] = hash member -> claim, KEYS[3] = sorted set
--           departed tag -> forget at (ms); one hash tag.
-- ARGV = member id, claim, ttl_ms, "1" to leave, key lifetime (ms) once the fleet is gone,
--        how long a departed member is remembered (ms).
-- Returns {flat claims (member, claim, ...), departed tags, 1 when this beat brings the member back
--          after another member's beat counted it out (it stalled past its TTL: the others may
--          have freed its slots and taken its share), else 0 (a first beat, a Redis that lost the
--          fleet: nobody acted on its absence)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local remember = tonumber(ARGV[6])
local function tag_of(member)
  return string.match(member, '([^:]*)$')
end
local back = 0
if ARGV[4] ~= '1' and redis.call('ZSCORE', KEYS[3], tag_of(ARGV[1])) then
  back = 1
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #dead > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('HDEL', KEYS[2], unpack(dead))
  for _, member in ipairs(dead) do
    redis.call('ZADD', KEYS[3], now + remember, tag_of(member))
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if ARGV[4] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  -- Back after being counted out (a stall, a partition): its new slots are live ones.
  redis.call('ZREM', KEYS[3], tag_of(ARGV[1]))
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  local lifetime = math.max(tonumber(ARGV[5]), remember)
  redis.call('PEXPIRE', KEYS[1], lifetime)
  redis.call('PEXPIRE', KEYS[2], lifetime)
  if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('PEXPIRE', KEYS[3], lifetime)
  end
end
return {redis.call('HGETALL', KEYS[2]), redis.call('ZRANGE', KEYS[3], 0, -1), back}
