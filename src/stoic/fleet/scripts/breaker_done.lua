-- A probe ended. ARGV[10] the lease token; ARGV[11] ok, failed, slow or none (no verdict).
-- A lease that is gone (expired, or the episode ended) makes the probe stale: granted = 0.
advance()
if s.st == 2 and redis.call('HDEL', leases, ARGV[10]) == 1 then
    granted = 1
    local verdict = ARGV[11]
    if verdict == 'ok' then
        s.pk = s.pk + 1
        dirty = true
        -- Closed once this replica's half_open_probes succeeded, or every permit of the episode
        -- (opened by a replica that may allow fewer: a rolling deploy) was taken and succeeded:
        -- no permit is left for another probe, so waiting for more would wedge it half-open.
        if s.pk >= probes or (s.pf == 0 and redis.call('HLEN', leases) == 0) then close('probes_succeeded') end
    elseif verdict == 'failed' then
        open('probe_failed')
    elseif verdict == 'slow' then
        open('probe_slow')
    else
        s.pf = s.pf + 1 -- no verdict: the permit goes back
        dirty = true
    end
end
return finish()
