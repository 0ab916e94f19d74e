-- stoic.fleet: add a replica's latency bucket counts to the fleet's sketch and read it back
-- (one round trip per push interval, never one per call).
-- KEYS[1]  the sketch hash {prefix:label}:latency: field L (landmark, server us), and one field
--          per bucket index holding its decayed weight
-- ARGV     half_life_us, ttl_ms, then pairs: bucket index, count
-- Reply    {age_us (now - L), field, value, field, value, ...} (every field of the hash)
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
local age = (now - landmark) / half
if age > 30 or age < -30 then
    local fade = 2 ^ (-age)
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
        if all[i] ~= 'L' then
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
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
local reply = redis.call('HGETALL', KEYS[1])
table.insert(reply, 1, math.floor(now - landmark))
return reply
