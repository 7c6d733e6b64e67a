-- One edge instance's heartbeat, atomic: drop members whose TTL ran out (by Redis's own clock, so
-- the instances' clocks do not matter) and remember them as departed, write this member's claim
-- and expiry (or remove it when it leaves), and return every live member's claim and the departed.
-- A departed member is one that stopped beating (crashed, killed, cut off): its streams died with
-- it, so the others free its concurrency slots (limiter/scripts/admit.lua) by its tag, the part of
-- its id after the last ':' (edge/request_ids.py). It is remembered for as long as a slot lives
-- (ARGV[6]; longer, its slots expired anyway) or until it beats again. One that leaves says so
-- itself after its streams settled, and is not remembered.
-- A silence of the whole fleet longer than ARGV[7] (no member's beat for that long, while the live
-- members beat every interval) was Redis's, out of every member's reach (a failover, a partition,
-- a server that stalled), not the members': every live member's expiry moves on by it, so the
-- first beat after an outage longer than a TTL counts nobody out (it named every other member
-- departed, their users' slots freed under their running streams, and sent them back through the
-- join wait). A member that died just before such a silence is counted out that much later.
-- A member back is told so until it says it heard (ARGV[8]): the beat that brought it back can run
-- with its answer lost (a reply slower than the client's timeout, which a RedisCluster client then
-- sends again), and a member told only once would never learn that the others took its share and
-- freed its slots.
-- The fleet's epoch (KEYS[6]) is made by the first beat on a Redis without it and lives as long as
-- the fleet's keys: a member unknown to Redis that finds the epoch it saw before was counted out
-- and forgotten since (cut off alone past ARGV[6]), not lost with the fleet (a Redis restarted
-- empty, FLUSHALL, a failover to an empty replica: a new epoch).
-- KEYS[1] = sorted set member -> expiry (ms), KEYS[2] = hash member -> claim, KEYS[3] = sorted set
--           departed tag -> forget at (ms), KEYS[4] = the last beat's time (ms), KEYS[5] = sorted
--           set tag of a member back, not yet heard -> forget at (ms), KEYS[6] = the fleet's
--           epoch; one hash tag.
-- ARGV = member id, claim, ttl_ms, "1" to leave, key lifetime (ms) once the fleet is gone,
--        how long a departed member is remembered (ms), the fleet's silence past which it was
--        Redis's (ms), "1" when the member heard that it is back.
-- Returns {flat claims (member, claim, ...), departed tags, 1 when this beat brings the member back
--          after another member's beat counted it out (it stalled past its TTL: the others may
--          have freed its slots and taken its share), or an earlier one did and the member has not
--          said it heard, else 0 (a first beat, a Redis that lost the fleet: nobody acted on its
--          absence), 1 when Redis held no entry of the member before this beat (its first beat, a
--          beat that brings it back, or a Redis that lost the fleet: restarted empty, the keys
--          expired after a silence of their lifetime), else 0, the fleet's epoch}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local remember = tonumber(ARGV[6])
local function tag_of(member)
  return string.match(member, '([^:]*)$')
end
local lifetime = math.max(tonumber(ARGV[5]), remember)
local last = redis.call('GET', KEYS[4])
if last then
  local silence = now - tonumber(last)
  if silence > tonumber(ARGV[7]) then
    local expiries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
    for i = 1, #expiries, 2 do
      redis.call('ZADD', KEYS[1], tonumber(expiries[i + 1]) + silence, expiries[i])
    end
  end
end
redis.call('SET', KEYS[4], now, 'PX', lifetime)
local epoch = redis.call('GET', KEYS[6])
if not epoch then
  -- Unique across the fleet's lives: the member that made it, and when to the microsecond.
  epoch = ARGV[1] .. '@' .. t[1] .. '.' .. t[2]
end
redis.call('SET', KEYS[6], epoch, 'PX', lifetime)
local tag = tag_of(ARGV[1])
if ARGV[8] == '1' or ARGV[4] == '1' then
  redis.call('ZREM', KEYS[5], tag)
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local back = 0
if ARGV[4] ~= '1' and (redis.call('ZSCORE', KEYS[3], tag) or redis.call('ZSCORE', KEYS[5], tag)) then
  back = 1
end
local unknown = 0
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  unknown = 1
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
  redis.call('ZREM', KEYS[3], tag)
  if back == 1 then
    redis.call('ZADD', KEYS[5], now + remember, tag)
  end
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[1], lifetime)
  redis.call('PEXPIRE', KEYS[2], lifetime)
  for _, key in ipairs({KEYS[3], KEYS[5]}) do
    if redis.call('EXISTS', key) == 1 then
      redis.call('PEXPIRE', key, lifetime)
    end
  end
end
return {redis.call('HGETALL', KEYS[2]), redis.call('ZRANGE', KEYS[3], 0, -1), back, unknown, epoch}
