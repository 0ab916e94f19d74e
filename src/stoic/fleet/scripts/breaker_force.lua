-- Manual control, fleet-wide. ARGV[10] open, closed or reset.
local mode = ARGV[10]
if mode == 'open' then
    if s.st ~= 3 then
        s.st, s.un, s.pf, s.pk, s.gen = 3, 0, 0, 0, s.gen + 1
        redis.call('DEL', leases)
        events[#events + 1] = 'opened:forced'
        dirty = true
    end
else
    if s.st ~= 0 then
        close(mode == 'reset' and 'reset' or 'forced')
    elseif mode == 'reset' then
        events[#events + 1] = 'reset' -- already closed: only the trip count is forgotten
    end
    if mode == 'reset' then
        s.tr = 0
        dirty = true
    end
end
return finish()
