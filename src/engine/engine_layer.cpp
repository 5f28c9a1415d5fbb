// layer engine (placeholder until its first source)
