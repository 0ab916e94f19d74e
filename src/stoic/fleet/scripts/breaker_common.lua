-- stoic.fleet: the shared breaker's state machine, prefixed to every breaker script.
-- KEYS[1]  the state hash {prefix:label}:breaker; KEYS[2] the probe leases {prefix:label}:probes
-- state hash fields: st (0 closed, 1 open, 2 half-open, 3 forced open), tr (consecutive trips),
--   un (open until, server us), cs (closed since, server us), gen (bumped at every transition),
--   pf (probe permits free), pk (probes succeeded); leases: token -> expiry (server us)
-- ARGV[1..9] ttl_ms, probes, initial_us, maximum_us, factor, jitter, reset_after_us,
--   probe_timeout_us, draw (the caller's jitter draw in [0, 1)); op arguments from ARGV[10]
-- Reply {st, tr, remaining_us (-1 unless open with an end), gen, granted, open_for_us, events...}
-- events: opened:<trigger> (opened:<probe trigger>:<probes in the episode> from half-open),
--   half_open, closed:<reason>, reset
local key, leases = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[1])
local probes = tonumber(ARGV[2])
local initial, maximum = tonumber(ARGV[3]), tonumber(ARGV[4])
local factor, jitter = tonumber(ARGV[5]), tonumber(ARGV[6])
local reset_after, probe_timeout = tonumber(ARGV[7]), tonumber(ARGV[8])
local draw = tonumber(ARGV[9])
local fields = {'st', 'tr', 'un', 'cs', 'gen', 'pf', 'pk'}
local s = {}
local raw = redis.call('HMGET', key, unpack(fields))
if raw[1] == false then
    s = {st = 0, tr = 0, un = 0, cs = now, gen = 0, pf = 0, pk = 0}
else
    for i, name in ipairs(fields) do
        local v = tonumber(raw[i])
        if v == nil then
            return redis.error_reply('STOICDATA breaker ' .. key .. ' field ' .. name .. ' is unexpected')
        end
        s[name] = v
    end
    if s.st ~= 0 and s.st ~= 1 and s.st ~= 2 and s.st ~= 3 then
        return redis.error_reply('STOICDATA breaker ' .. key .. ' state is unexpected')
    end
end
local events = {}
local open_for = 0
local granted = 0
local dirty = false

local function open(trigger)
    -- A failed probe's event carries the episode's probes (those that succeeded, and this one).
    local event = 'opened:' .. trigger
    if s.st == 2 then event = event .. ':' .. (s.pk + 1) end
    if s.st == 0 and now - s.cs >= reset_after then s.tr = 0 end -- sustained health forgets trips
    s.tr = s.tr + 1
    local base = maximum
    if s.tr == 1 or factor == 1 then
        base = initial
    elseif (s.tr - 1) * math.log(factor) < math.log(maximum / initial) then
        base = math.min(maximum, math.floor(initial * factor ^ (s.tr - 1) + 0.5))
    end
    open_for = math.max(1, base - math.floor(base * jitter * draw + 0.5))
    s.st, s.un, s.pf, s.pk, s.gen = 1, now + open_for, 0, 0, s.gen + 1
    redis.call('DEL', leases)
    events[#events + 1] = event
    dirty = true
end

local function close(reason)
    s.st, s.cs, s.un, s.pf, s.pk, s.gen = 0, now, 0, 0, 0, s.gen + 1
    redis.call('DEL', leases)
    events[#events + 1] = 'closed:' .. reason
    dirty = true
end

-- The lazy transitions due now: open -> half-open at the end of the open period; a probe lease
-- held past probe_timeout is a failed probe (a hung holder cannot wedge the fleet).
-- TIME is the server's wall clock: an instant further ahead than any period can reach was
-- written before the clock stepped back, and is brought back within that period (an open
-- period never outlasts `maximum`, a lease never outlives `probe_timeout`).
local function advance()
    if s.st == 1 and s.un - now > maximum then
        s.un = now + maximum
        dirty = true
    end
    if s.cs > now then
        s.cs = now
        dirty = true
    end
    if s.st == 1 and now >= s.un then
        s.st, s.pf, s.pk, s.gen = 2, probes, 0, s.gen + 1
        redis.call('DEL', leases)
        events[#events + 1] = 'half_open'
        dirty = true
    end
    if s.st == 2 then
        local held = redis.call('HGETALL', leases)
        for i = 1, #held, 2 do
            local expiry = tonumber(held[i + 1])
            if expiry == nil or expiry <= now then
                open('probe_timeout')
                return
            end
            if expiry - now > probe_timeout then
                redis.call('HSET', leases, held[i], string.format('%.0f', now + probe_timeout))
            end
        end
    end
    if s.st == 0 and s.tr > 0 and now - s.cs >= reset_after then
        s.tr = 0
        dirty = true
    end
end

local function finish()
    if dirty then
        redis.call('HSET', key, 'st', s.st, 'tr', s.tr, 'un', string.format('%.0f', s.un),
            'cs', string.format('%.0f', s.cs), 'gen', s.gen, 'pf', s.pf, 'pk', s.pk)
    end
    -- Every key expires: the TTL outlives the open period by ttl_ms and is renewed on every use,
    -- so state (a forced open included) lives while any replica uses it, and ttl_ms after the last.
    local keep = ttl
    if s.st == 1 and s.un > now then keep = keep + math.ceil((s.un - now) / 1000) end
    if redis.call('EXISTS', key) == 1 then redis.call('PEXPIRE', key, keep) end
    if redis.call('EXISTS', leases) == 1 then redis.call('PEXPIRE', leases, keep) end
    local remaining = -1
    if s.st == 1 then remaining = math.max(0, s.un - now) end
    local reply = {s.st, s.tr, remaining, s.gen, granted, open_for}
    for _, e in ipairs(events) do reply[#reply + 1] = e end
    return reply
end
