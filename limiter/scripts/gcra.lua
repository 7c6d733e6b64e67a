-- Prepended to every script after clock.lua (limiter/scripts/__init__.py): GCRA's arithmetic, the
-- same IEEE operations in the same order as limiter/policy.py's span_us and remaining, so both
-- sides agree to the microsecond. A budget of `capacity` per `window` microseconds moves its TAT
-- by window / capacity a unit, kept exact: rounded up to a whole microsecond per unit, fast tiers
-- were held far under their setting (40M tokens a minute enforced as 30M).

-- How far `cost` units move the TAT, rounded up (a hair over a microsecond is that microsecond:
-- a cost of the whole capacity spans exactly the window).
local function span(cost, window, capacity)
  return math.ceil(cost * (window / capacity) - 0.001)
end

-- The units the budget holds at `now` (a hair under a unit is that unit), none at worst: a TAT past
-- the window (restore.lua adding several edges' counts) is a longer wait, not a negative count.
local function room(tat, window, capacity)
  return math.max(0, math.floor((now + window - math.max(tat, now)) / (window / capacity) + 0.000001))
end
