-- Prepended to every script (limiter/scripts/__init__.py): the clock and key-expiry margin they share.
-- ARGV[1]: now_override_us ('' = Redis TIME, the one clock every edge instance shares; tests only).
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- Keys outlive the moment their TAT passes by this much, so a key never vanishes while it matters.
local EXPIRY_MARGIN_MS = 1000

