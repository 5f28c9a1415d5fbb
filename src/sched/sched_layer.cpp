// layer sched (placeholder until its first source)
