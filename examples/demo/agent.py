"""A tiny scripted agent for the demo: it reads its prompt and acts out the seed's
worked example. A real run uses claude; this needs no model and no network."""

import os
import subprocess
import sys

with open(sys.argv[1], encoding="utf-8") as f:
    prompt = f.read()
task = os.environ.get("FLEETRUN_TASK_NAME", "")


def commit(message):
    subprocess.run(["git", "add", "-A"], check=True)
    subprocess.run(
        ["git", "-c", "user.name=demo-agent", "-c", "user.email=demo@example.invalid", "commit", "-q", "-m", message],
        check=True,
    )


if task == "fix-it":
    # the first attempt gets it wrong; the retry's prompt carries the verifier's output
    word = "final" if "must contain exactly the word final" in prompt else "draft"
    with open("FIX.txt", "w") as f:
        f.write(word + "\n")
    commit(f"FIX.txt: {word}")
    print(f"wrote {word} to FIX.txt")
elif task == "user-schema":
    with open("schema.sql", "w") as f:
        f.write("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL, created_at TEXT);\n")
    print("Added the users table in schema.sql (email, created_at).")  # left uncommitted: fleetrun commits it
elif task == "user-api":
    told = "schema.sql" in prompt  # the handoff of user-schema is in the prompt
    with open("api.py", "w") as f:
        f.write("# CRUD endpoints for users" + (" on the table from schema.sql\n" if told else "\n"))
    commit("api.py: CRUD endpoints")
    print("Added api.py with CRUD endpoints for users.")
else:
    print(f"nothing scripted for {task!r}")
