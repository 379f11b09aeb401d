"""ops: the loop's steps that combine the districts below (canary, draft removal, troubleshoot)."""
