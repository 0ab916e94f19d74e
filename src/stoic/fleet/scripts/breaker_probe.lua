-- Take a half-open probe lease: exactly `probes` leases per episode fleet-wide, each expiring.
-- ARGV[10] the lease token (unique per call)
advance()
if s.st == 2 and s.pf > 0 then
    s.pf = s.pf - 1
    redis.call('HSET', leases, ARGV[10], string.format('%.0f', now + probe_timeout))
    granted = 1
    dirty = true
end
return finish()
