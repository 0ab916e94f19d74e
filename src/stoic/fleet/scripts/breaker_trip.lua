-- A replica's window tripped: open the shared breaker, unless it is no longer closed.
-- ARGV[10] trigger (failure_rate or slow_calls)
advance()
if s.st == 0 then open(ARGV[10]) end
return finish()
