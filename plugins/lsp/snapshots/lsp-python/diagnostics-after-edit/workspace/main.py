from shapes import Square, total

print(total([Square(2), Square(3)]))
