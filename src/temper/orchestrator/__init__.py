"""temper.orchestrator"""
