"""The mailbox plugin (issue 13): roles, their mailboxes, and the Claude Code hooks that deliver to them."""
