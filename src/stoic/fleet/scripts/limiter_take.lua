-- stoic.fleet: take permits from a shared token bucket (one decision, one round trip).
-- KEYS[1]  the bucket hash {prefix:label}:bucket, fields c (credit), s (stamp, server us) and
--          p (the units one permit cost the replica that wrote c)
-- ARGV     permits, r (units earned per us), p (units per permit), capacity (burst * p), ttl_ms
-- Reply    {granted 0/1, wait_us (0 when granted), whole permits left}
-- Exact integer credit: every value stays below 2^53, checked by the client at construction,
-- so Lua's doubles hold them exactly. Time is the server's (TIME), never a client clock.
-- Replicas of different rates may share the bucket (a rolling deploy): the credit is a number of
-- permits, so one written in another replica's units is converted (rounded down) into this one's.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local permits = tonumber(ARGV[1])
local r = tonumber(ARGV[2])
local p = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local cost = permits * p
local raw = redis.call('HMGET', KEYS[1], 'c', 's', 'p')
local credit, stamp
if raw[1] == false and raw[2] == false then
    credit, stamp = cap, now -- a missing bucket is a full one (it expired while idle)
else
    credit, stamp = tonumber(raw[1]), tonumber(raw[2])
    if credit == nil or stamp == nil or credit < 0 or credit ~= math.floor(credit) then
        return redis.error_reply('STOICDATA bucket ' .. KEYS[1] .. ' holds unexpected values')
    end
    if raw[3] ~= false then -- (a bucket written before p was kept: in this replica's units)
        local written = tonumber(raw[3])
        if written == nil or written < 1 or written ~= math.floor(written) then
            return redis.error_reply('STOICDATA bucket ' .. KEYS[1] .. ' holds unexpected values')
        end
        if written ~= p then credit = math.floor(credit / written * p) end
    end
    if credit > cap then credit = cap end -- another replica configured a larger burst
    local elapsed = now - stamp
    if elapsed > 0 then
        local need = cap - credit
        -- r >= 1, so elapsed >= need already refills it; otherwise elapsed * r < cap * r < 2^53
        if elapsed >= need or elapsed * r >= need then credit = cap else credit = credit + elapsed * r end
        stamp = now
    elseif elapsed < 0 then
        stamp = now -- the server's clock stepped back: refill from here, not from the old future
    end
end
local granted, wait = 0, 0
if credit >= cost then
    credit = credit - cost
    granted = 1
else
    local deficit = cost - credit
    wait = math.floor(deficit / r)
    -- correct the double division to the exact integer ceiling
    while wait * r < deficit do wait = wait + 1 end
    while wait > 0 and (wait - 1) * r >= deficit do wait = wait - 1 end
end
redis.call('HSET', KEYS[1], 'c', string.format('%.0f', credit), 's', string.format('%.0f', stamp), 'p',
    string.format('%.0f', p))
redis.call('PEXPIRE', KEYS[1], ttl)
return {granted, wait, math.floor(credit / p)}
