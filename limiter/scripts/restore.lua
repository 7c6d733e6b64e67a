-- After a store outage: put back what this edge instance counted, atomically, before it admits on
-- Redis again. Without it, requests admitted while Redis was down (or lost with a restarted Redis)
-- would not count there, and Redis would admit as many again. Each of N edge instances restores
-- its own counts; together they must add up, where taking the later TAT kept only one instance's:
-- two instances that each admitted their half of a user's burst on the fallback left Redis
-- counting one half, and the user could spend the other half again.
--
-- Per budget (requests, tokens) two counts go in, and the TAT becomes the later of:
-- - Redis's TAT plus this instance's ledger: what its fallback admitted or charged alone since
--   Redis last took it (limiter/memory.py _Ledger), added on top of max(TAT, now). Redis never saw
--   those decisions, so N instances' ledgers add up whether Redis kept its data or not; once per
--   ledger: Redis keeps the ledger's TATs as last added (KEYS[4], named by instance and ledger
--   generation, in the units the ledger began in: the twin rescales a ledger when the fleet's count
--   changes, and says how, so both are compared in those units), and a restore sent again (a reply
--   lost, a pipeline resent after NOSCRIPT, a newer snapshot of the same ledger) adds only how far
--   its TATs are past those, so the same snapshot twice adds nothing the second time.
-- - now plus this instance's whole count (its twin's lead in the tier's units: all its own traffic,
--   before the outage too): for a Redis restarted empty, one instance alone gets back what it
--   counted.
-- Approximate:
-- - A Redis restarted empty gets back each instance's fallback admits, but of what Redis itself had
--   admitted before the outage only the largest instance's lead: the other instances' share of it
--   is lost with Redis's data. Summing every instance's whole lead instead was tried and dropped:
--   a twin's lead drains at 1/N of the tier's rate, so the sum counted finished bursts again and
--   blocked users within their limits after a routine restore (a dropped connection) on a Redis
--   that kept everything.
-- - Ledgers drain as GCRA TATs at the twin's rate (1/N of the tier's), so a long outage with
--   steady spending does not block the user for its whole length afterwards; instances restoring
--   t apart under-count the earlier one's by up to t * (1 - 1/N) of refill (milliseconds to a
--   backoff after Redis returns).
-- - An admit whose Redis answer was lost and that the fallback then admitted counts twice.
-- Then the running requests' slots that Redis does not hold go back. A request settled meanwhile
-- (its record is 'done' or 'done:cancelled'; 'cancelled' is a request still running) gets no slot
-- back. Idempotent:
-- restoring the same snapshot twice changes nothing more.
-- KEYS: requests TAT, tokens TAT, concurrency set, this instance's ledger as last added, then each
--       running request's record (one {user} hash tag)
-- ARGV: now_override_us ('' = Redis TIME; tests only), request_ahead_us, token_ahead_us (this
--       instance's whole count: its twin's lead in the tier's units), lease_ttl_us, then the
--       ledger: instance count (N), its clock's now, request TAT, token TAT (its units and clock:
--       N times the tier's intervals; TATs 0 when there is none), the count it began under (B) and
--       the offset its rescales left (its TATs are those in B's units times N / B plus it), then
--       the running requests' ids
local lease_ttl = tonumber(ARGV[4])
local instance_count = tonumber(ARGV[5])
local ledger_now = tonumber(ARGV[6])
local ledger = {tonumber(ARGV[7]), tonumber(ARGV[8])}
local born_count = tonumber(ARGV[9])
local offset = tonumber(ARGV[10])
local whole = {tonumber(ARGV[2]), tonumber(ARGV[3])}
local FIRST_ID = 11
-- The kept copy must outlive its ledger: the twin stretches a ledger when the fleet grows (its
-- lead in the new count's units), and a resend after the copy expired would add it all again. It
-- is kept this many times the ledger's lead at each restore that carries it, and stretched then
-- (a fleet growing more than this many times over between two restores of one ledger would still
-- outlive it: a part of that ledger added again).
local KEPT_STRETCH = 16

local function ceil_ms(us)
  return math.floor((us + 999) / 1000)
end

-- A ledger time in the units it began in, and back.
local function born(us)
  return math.floor((us - offset) * born_count / instance_count)
end
local function current(us)
  return us * instance_count / born_count + offset
end

-- How far each ledger TAT is past the one already added (in the tier's units), and the key kept.
local added = {0, 0}
if ledger[1] > ledger_now or ledger[2] > ledger_now then
  local before = redis.call('HMGET', KEYS[4], 'r', 't')
  local now_born = born(ledger_now)
  local kept = {0, 0}
  local last = ledger_now
  for i = 1, 2 do
    local prior = tonumber(before[i]) or 0
    local tat = born(ledger[i])
    local from = math.max(prior, now_born)
    if tat > from then
      added[i] = math.ceil((tat - from) / born_count)
    end
    kept[i] = math.max(tat, prior)  -- a late, older snapshot lowers nothing
    last = math.max(last, current(kept[i]))
  end
  local keep_ms = ceil_ms(last - ledger_now) * KEPT_STRETCH + EXPIRY_MARGIN_MS
  if added[1] > 0 or added[2] > 0 then
    redis.call('HSET', KEYS[4], 'r', string.format('%d', kept[1]), 't', string.format('%d', kept[2]))
    redis.call('PEXPIRE', KEYS[4], keep_ms)
  else
    local ttl = redis.call('PTTL', KEYS[4])
    if ttl >= 0 and ttl < keep_ms then
      redis.call('PEXPIRE', KEYS[4], keep_ms)
    end
  end
end

local function restore(key, i)
  local tat = tonumber(redis.call('GET', key)) or 0
  local new_tat = tat
  if added[i] > 0 then
    new_tat = math.max(tat, now) + added[i]
  end
  if whole[i] > 0 then
    new_tat = math.max(new_tat, now + whole[i])
  end
  if new_tat > tat then
    redis.call('SET', key, string.format('%d', new_tat), 'PX', ceil_ms(new_tat - now) + EXPIRY_MARGIN_MS)
  end
end

restore(KEYS[1], 1)
restore(KEYS[2], 2)
if #ARGV >= FIRST_ID then
  -- Lapsed entries pruned first, as admit.lua does: a lapsed entry holds nothing (charge.lua,
  -- settle.lua), and left in place it would block the NX below, so a running request would get
  -- its slot back only if some admit had pruned first.
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%d', now))
  local expiry = string.format('%d', now + lease_ttl)
  for i = FIRST_ID, #ARGV do
    local record = redis.call('GET', KEYS[i - FIRST_ID + 5])
    if not record or record == 'cancelled' then
      redis.call('ZADD', KEYS[3], 'NX', expiry, ARGV[i])
    end
  end
  redis.call('PEXPIRE', KEYS[3], ceil_ms(lease_ttl) + EXPIRY_MARGIN_MS)
end
return 1
