// layer kv
