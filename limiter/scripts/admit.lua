-- One admission, atomically: requests (GCRA), tokens (GCRA over input + initial output lease) and
-- concurrency (a set of live request ids scored by lease expiry). Mirrors limiter/policy.py:admit.
-- Idempotent per request id, so a call retried (or run late, after its caller gave up on it)
-- never counts twice: a request that holds its slot is answered "allowed" again at no cost, and a
-- request already settled (its record, KEYS[4], is set by settle.lua) is refused at no cost. (A
-- cancel marks only a request holding its slot, answered above that check.)
-- KEYS: requests TAT, tokens TAT, concurrency set, the request's record (one {user} hash tag:
--       one Cluster slot); for a named tier, then the user's budgets as kept before budgets were
--       per tier (requests TAT, tokens TAT) and the mark of the tier they went to: they seed the
--       budgets of the first named tier the user is admitted in (a deploy of per-tier budgets
--       would otherwise give every user a whole window afresh), and of no other (spent in the
--       user's tier before the deploy, they would throttle a tier it moves to, in the wrong
--       units). Needed for one longest window after that deploy; those keys expire by then.
-- ARGV: now_override_us ('' = Redis TIME, the clock every edge instance shares; set by tests only),
--       request_id, request_window_us, request_capacity, token_window_us, token_capacity,
--       max_concurrent, input_tokens, lease_tokens, lease_ttl_us,
--       departed holders (space-separated request-id prefixes, all of one length, of the edge
--       instances that stopped beating, edge/membership/; usually ''). A request id starts with
--       its holder's prefix (edge/request_ids.py), and a holder that died cannot settle: when the
--       user's slots are full, those it held are freed here rather than a lease TTL later (their
--       streams died with it; their unused tokens are not refunded, as when a lease expires).
--       The twin (policy.py) serves one instance and has no fleet.
--       reply_tokens: the whole reply an untouched budget holds beside the prompt (policy.py's
--       reply_to_wait_for): a refused request is told to wait until it fits too, not only the lease;
--       the tier's name (with the unnamed keys above).
-- Returns: allowed (0/1), limit (0 none, 1 requests, 2 tokens, 3 concurrency; 0 with allowed 0:
--          the request was settled already), retry_after_ms,
--          remaining_requests, reset_requests_ms, remaining_tokens, reset_tokens_ms,
--          request_wait_ms, token_wait_ms (what those two limits alone would wait; 0 when allowed:
--          the caller lowers a concurrency wait to its estimate and picks the binding limit again)

local request_id = ARGV[2]
local request_window = tonumber(ARGV[3])
local request_capacity = tonumber(ARGV[4])
local token_window = tonumber(ARGV[5])
local token_capacity = tonumber(ARGV[6])
local max_concurrent = tonumber(ARGV[7])
local cost_tokens = tonumber(ARGV[8]) + tonumber(ARGV[9])
local lease_ttl = tonumber(ARGV[10])

local function ceil_ms(us)
  return math.floor((us + 999) / 1000)
end

-- The TAT if `cost` is allowed, and how long until it would be (0: allowed now).
local function gcra(tat, window, capacity, cost)
  local new_tat = math.max(tat, now) + span(cost, window, capacity)
  return new_tat, math.max(0, new_tat - (now + window))
end

-- Whether the unnamed budgets seed this tier's: they have not expired, and this is the tier they
-- went to (the first named tier admitted in, marked for as long as they last).
local function seeds_this_tier()
  local last = math.max(redis.call('PTTL', KEYS[5]), redis.call('PTTL', KEYS[6]))
  if last <= 0 then
    return false
  end
  local marked = redis.call('GET', KEYS[7])
  if not marked then
    redis.call('SET', KEYS[7], ARGV[13], 'PX', last)
    return true
  end
  return marked == ARGV[13]
end

-- A Redis at its maxmemory under noeviction refuses a script only at its first write that may grow
-- memory (SET, ZADD), never a later one: it cannot stop a script half-way. This script's first
-- write was the prune below (ZREMRANGEBYSCORE, never refused), so a full Redis admitted and grew
-- on while the charges and settles that followed were refused. A write of nothing comes first (XX:
-- only a member already there, and no request id is empty; no key made or changed, nothing
-- replicated): a full Redis refuses the admit whole, before anything is written, and the tier's
-- on_store_failure answers it. ZADD, not a command of its own: a least-privilege ACL grants it.
redis.call('ZADD', KEYS[3], 'XX', 0, '')

local request_tat = tonumber(redis.call('GET', KEYS[1]))
local token_tat = tonumber(redis.call('GET', KEYS[2]))
if KEYS[5] and (not request_tat or not token_tat) and seeds_this_tier() then
  request_tat = request_tat or tonumber(redis.call('GET', KEYS[5]))
  token_tat = token_tat or tonumber(redis.call('GET', KEYS[6]))
end
request_tat = request_tat or 0
token_tat = token_tat or 0

local function reply(allowed, limit, wait, request_wait, token_wait)
  return {
    allowed,
    limit,
    ceil_ms(wait),
    room(request_tat, request_window, request_capacity),
    ceil_ms(math.max(request_tat, now) - now),
    room(token_tat, token_window, token_capacity),
    ceil_ms(math.max(token_tat, now) - now),
    ceil_ms(request_wait),
    ceil_ms(token_wait),
  }
end

redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%d', now))
if redis.call('ZSCORE', KEYS[3], request_id) then
  return reply(1, 0, 0, 0, 0)
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return reply(0, 0, 0, 0, 0)
end

local new_request_tat, request_wait = gcra(request_tat, request_window, request_capacity, 1)
local new_token_tat, token_wait = gcra(token_tat, token_window, token_capacity, cost_tokens)

local held = redis.call('ZCARD', KEYS[3])
if held >= max_concurrent and ARGV[11] ~= '' then
  local departed, width = {}, 0
  for prefix in string.gmatch(ARGV[11], '%S+') do
    departed[prefix] = true
    width = #prefix
  end
  for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    if departed[string.sub(id, 1, width)] then
      redis.call('ZREM', KEYS[3], id)
      held = held - 1
    end
  end
end

-- The bound: the earliest lease expiry, when a slot frees even if its holder died unnoticed.
local concurrency_wait = 0
if held >= max_concurrent then
  local earliest = now
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if first[2] then
    earliest = tonumber(first[2])
  end
  concurrency_wait = math.max(1, earliest - now)
end

-- The binding limit is the one with the longest wait; on a tie the first in this order.
local function binding(waits)
  local limit, wait = 0, 0
  for i = 1, 3 do
    if waits[i] > wait then
      limit = i
      wait = waits[i]
    end
  end
  return limit, wait
end
local limit, wait = binding({request_wait, token_wait, concurrency_wait})

if limit == 0 then
  request_tat = new_request_tat
  token_tat = new_token_tat
  redis.call('SET', KEYS[1], string.format('%d', request_tat), 'PX', ceil_ms(request_tat - now) + EXPIRY_MARGIN_MS)
  redis.call('SET', KEYS[2], string.format('%d', token_tat), 'PX', ceil_ms(math.max(token_tat, now) - now) + EXPIRY_MARGIN_MS)
  redis.call('ZADD', KEYS[3], string.format('%d', now + lease_ttl), request_id)
  redis.call('PEXPIRE', KEYS[3], ceil_ms(lease_ttl) + EXPIRY_MARGIN_MS)
  return reply(1, 0, 0, 0, 0)
end
local reply_tokens = tonumber(ARGV[12])
if reply_tokens > tonumber(ARGV[9]) then
  local _, whole_wait = gcra(token_tat, token_window, token_capacity, tonumber(ARGV[8]) + reply_tokens)
  token_wait = whole_wait
  limit, wait = binding({request_wait, token_wait, concurrency_wait})
end
return reply(0, limit, wait, request_wait, token_wait)
