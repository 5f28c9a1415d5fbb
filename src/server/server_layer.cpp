// layer server (placeholder until its first source)
