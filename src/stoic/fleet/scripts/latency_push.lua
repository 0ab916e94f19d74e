-- stoic.fleet: add a replica's latency bucket counts to the fleet's sketch and read it back
-- (one round trip per push interval, never one per call).
-- KEYS[1]  the sketch hash {prefix:label}:latency: field L (landmark, server us), field T (the
--          last push, server us), and one field per bucket index holding its decayed weight
-- ARGV     half_life_us, ttl_ms, then pairs: bucket index, count
-- Reply    {age_us (now - L), field, value, field, value, ...} (every field of the hash but T)
-- Forward decay (Cormode et al. 2009): a sample at time t weighs 2^((t - L) / half_life), so
-- older samples fade relative to newer ones without rewriting them; quantiles are ratios of
-- weights, so the client scales by 2^(-age / half_life) only to count the effective samples.
-- When the weights grow large the hash is rescaled to a new landmark and faded buckets dropped.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local half = tonumber(ARGV[1])
local landmark = tonumber(redis.call('HGET', KEYS[1], 'L'))
if landmark == nil then
    landmark = now
    redis.call('HSET', KEYS[1], 'L', string.format('%.0f', now))
end
-- TIME is the server's wall clock: a push before the last one (the clock stepped back) carries
-- on from the last push as if no time had passed since, so the newest samples weigh 1 from now
-- on instead of 2^-(the step) of the old ones until the clock catches up. (Without T, a sketch
-- written before it was kept: from the landmark.)
local last = tonumber(redis.call('HGET', KEYS[1], 'T')) or landmark
local age = (now - landmark) / half
local fade = nil
if now < last then
    fade = 2 ^ (-(last - landmark) / half)
elseif age > 30 then
    fade = 2 ^ (-age)
end
if fade ~= nil then
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
        if all[i] ~= 'L' and all[i] ~= 'T' then
            local v = (tonumber(all[i + 1]) or 0) * fade
            if v < 1e-6 then
                redis.call('HDEL', KEYS[1], all[i])
            else
                redis.call('HSET', KEYS[1], all[i], string.format('%.17g', v))
            end
        end
    end
    landmark = now
    age = 0
    redis.call('HSET', KEYS[1], 'L', string.format('%.0f', now))
end
if #ARGV > 2 then
    local weight = 2 ^ age
    for i = 3, #ARGV, 2 do
        redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], tonumber(ARGV[i + 1]) * weight)
    end
end
redis.call('HSET', KEYS[1], 'T', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
local all = redis.call('HGETALL', KEYS[1])
local reply = {math.floor(now - landmark)}
for i = 1, #all, 2 do
    if all[i] ~= 'T' then
        reply[#reply + 1] = all[i]
        reply[#reply + 1] = all[i + 1]
    end
end
return reply
