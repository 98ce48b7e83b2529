"""temper.weights"""
