// layer models
