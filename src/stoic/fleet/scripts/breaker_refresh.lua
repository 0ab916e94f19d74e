-- Read the shared state for a replica's local copy (applying the transitions due now).
advance()
return finish()
